"""Host RAM before the planned steps (wrap + profiling) on the CPU, with and without the swap allowance.

Runs ``tests/offload/setup_rss_probe.py`` in fresh processes on a 120M-parameter Llama (478 MB of
float32 weights): ``profile_host_fraction=10`` swaps every block while profiling (carina's behaviour
before the allowance), the default (0.1) swaps within 10% of the parameters' and optimizer state's
host bytes and profiles the other blocks under recompute. Writes
``benchmarks/results/cpu/offload_setup_rss.json``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/offload/bench_setup_rss.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from carina.core.bench import Figure, make_record, write_record

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "offload" / "setup_rss_probe.py"
SHAPE = ["--hidden", "1024", "--layers", "8", "--vocab", "8192", "--rows", "2", "--seq", "512", "--steps", "1"]


def probe(*extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(PROBE), *SHAPE, *extra], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(run: dict) -> dict:
    planned, model = run["planned_host_bytes"], run["model_bytes"]
    base = run["rss_start"]
    return {
        **{k: v for k, v in run.items() if k != "losses"},
        "setup_rss_over_planned_plus_model": (run["rss_peak_profile"] - base) / (planned + model),
        "wrap_rss_over_planned_plus_model": (run["rss_peak_wrap"] - base) / (planned + model),
        "profile_host_ledger_over_planned": run["ledger_host_peak_profile"] / planned,
        "losses": run["losses"],
    }


def main() -> None:
    runs = {}
    for dtype in ("float32", "bfloat16"):
        runs[f"{dtype}_before"] = summary(probe("--dtype", dtype, "--fraction", "10"))
        runs[f"{dtype}_after"] = summary(probe("--dtype", dtype))
        for k in ("before", "after"):
            r = runs[f"{dtype}_{k}"]
            peak = (r["rss_peak_profile"] - r["rss_start"]) / 1e6
            print(
                f"{dtype:9} {k:6} setup RSS peak {peak:7.1f} MB = {r['setup_rss_over_planned_plus_model']:.2f}x "
                f"(planned host + model); host ledger {r['profile_host_ledger_over_planned']:.2f}x planned; "
                f"wrap {r['wrap_rss_over_planned_plus_model']:.2f}x"
            )
    after, before = runs["float32_after"], runs["float32_before"]
    figs = [
        Figure(
            name=key,
            value=after[key],
            unit="x",
            higher_is_better=False,
            peers={"unbounded profiling swaps": before[key]},
        )
        for key in ("setup_rss_over_planned_plus_model", "profile_host_ledger_over_planned")
    ]
    config = {
        "model": "Llama hidden 1024, 8 layers, vocab 8192",
        "params": after["model_bytes"] // 4,
        "tokens_per_micro_batch": 1024,
        "device": "cpu",
        "device_budget": 1 << 30,
        "profile_steps": 2,
    }
    rec = make_record(
        name="offload_setup_rss",
        figures=figs,
        config=config,
        command="PYTHONPATH=$PWD/src .venv/bin/python benchmarks/offload/bench_setup_rss.py",
        metrics=runs,
        notes="Peak RSS (VmHWM, reset per phase) from before wrap() to the end of the profiling steps, minus "
        "RSS before the model was built, over (planned host bytes + the model's float32 bytes). On the CPU "
        "the device tier is RAM too, so RSS also holds the device-side activations and compute temporaries. "
        "'before' = profile_host_fraction=10 (every block swapped while profiling, as before the allowance); "
        "'after' = the default 0.1. Losses are bitwise equal between the two.",
    )
    print("wrote", write_record(rec))


if __name__ == "__main__":
    main()
