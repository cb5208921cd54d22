"""Host RAM before the planned steps: wrap() and the profiling steps stay near the planned host bytes.

Each case runs ``setup_rss_probe.py`` in a fresh process (peak RSS from ``/proc/self/status`` VmHWM,
reset per phase) on a 23M-parameter Llama (94 MB of float32 weights) whose profiled activations
(278 MB, six blocks of 46 MB) are more than half its planned host bytes (469 MB).
``profile_host_fraction=10`` swaps every block while profiling, as carina did before the
allowance existed: its host ledger peaked at 1.59x and its RSS at 2.0x (planned + model bytes)
when this test was written; with the default 0.1 they were 1.10x and 1.51x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("setup_rss_probe.py")

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")


def _probe(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    return subprocess.Popen(
        [sys.executable, str(PROBE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _result(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> tuple[dict, dict]:
    bounded, unbounded = _probe(), _probe("--fraction", "10")
    return _result(bounded), _result(unbounded)


def test_profiling_swaps_stay_within_the_host_allowance(runs):
    new, old = runs
    planned = new["planned_host_bytes"]
    # the allowance changes nothing the plan is made from (bytes; times are not compared) nor the losses
    assert new["act_bytes"] == old["act_bytes"]
    assert planned == old["planned_host_bytes"]
    assert new["losses"] == old["losses"]
    # host ledger while profiling: parameters + optimizer state + at most 10% of them in swaps
    assert new["ledger_host_peak_profile"] <= 1.10 * planned
    assert old["ledger_host_peak_profile"] >= planned + sum(old["act_bytes"])  # everything was swapped


def test_setup_peak_rss_is_bounded_by_planned_plus_model_bytes(runs):
    new, old = runs
    bound = new["planned_host_bytes"] + new["model_bytes"]
    ratio = (new["rss_peak_profile"] - new["rss_start"]) / bound
    old_ratio = (old["rss_peak_profile"] - old["rss_start"]) / bound
    assert ratio <= 1.65, ratio  # 1.51 measured; unbounded profiling swaps: 2.0
    assert old_ratio > 1.8, old_ratio


def test_wrap_frees_the_original_parameters_as_it_copies_them(runs):
    new, _ = runs
    # wrap's own peak is its final footprint plus far less than the model: no full second copy
    assert new["rss_peak_wrap"] - new["rss_after_wrap"] < 0.25 * new["model_bytes"]
    assert new["rss_peak_wrap"] - new["rss_start"] <= new["planned_host_bytes"] + new["model_bytes"]
