"""Tiny Llama + AdamW: train, SIGKILL mid-save, restart, continue -> bitwise the uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "carina.testing.ckpt", "--model", "llama", "--steps", "8", "--save-every", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_llama_resume_is_bitwise(tmp_path: Path) -> None:
    ref = _run(["--dir", str(tmp_path / "ref"), "--writer", "sync"])
    assert ref.returncode == 0, ref.stderr
    reference = json.loads(ref.stdout)
    d = str(tmp_path / "run")
    # The fork child writing step 6 kills the trainer while the data file is half written.
    crashed = _run(["--dir", d, "--writer", "fork", "--crash-phase", "data_chunk", "--crash-step", "6",
                    "--crash-target", "trainer"])  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    resumed = _run(["--dir", d, "--writer", "fork", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["start"] in (4, 6)
    assert out["losses"] == reference["losses"][out["start"] :]
    assert out["params_sha256"] == reference["params_sha256"]
