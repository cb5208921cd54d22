"""``carina train --ckpt-every K``: SIGKILL mid-run, ``--resume``: bitwise the losses of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from carina.ckpt.storage import read_manifest
from carina.cli.app import app
from carina.cli.train import KILL_ENV

# A device budget below what resident mode needs (5.4 MiB for tiny): the CLI run offloads, so the resume
# covers carina.offload's hooked model and its lent state (resident runs: tests/offload/test_resident.py).
_ARGS = ["train", "--model", "tiny", "--steps", "6", "--device", "cpu", "--device-budget", "4MiB", "--json"]


def _train(*extra: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, [*_ARGS, *extra])
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.output))


def _tensor_crcs(step_dir: Path) -> dict[str, int]:
    m = read_manifest(str(step_dir))
    return {t.name: t.crc32 for s in m.shards for t in s.tensors if t.name.startswith(("model/", "optim/state"))}


def test_train_command_has_offload_disagg_and_checkpoint_options() -> None:
    res = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output  # once failed: two sources defined --ckpt-every (duplicate parameter)
    options = ("--device-budget", "--disagg", "--ps-shards", "--ckpt-every", "--ckpt-dir", "--resume", "--ckpt-writer")
    for opt in options:
        assert opt in res.output, opt


@pytest.mark.slow
def test_train_killed_and_resumed_is_bitwise(tmp_path: Path) -> None:
    plain = _train()["result"]["losses"]  # offload's own loop, no checkpoints
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref = _train("--ckpt-every", "2", "--ckpt-dir", str(ref_dir))
    assert ref["result"]["losses"] == plain  # the checkpointing loop trains exactly as offload's
    assert ref["ckpt"] == {"resumed_from": 0, "saved": [2, 4, 6], "dir": str(ref_dir)}
    cmd = [sys.executable, "-c", "from carina.cli.app import main; main()", *_ARGS]
    env = {**os.environ, KILL_ENV: "5"}  # SIGKILL after step 5, step 2 committed: the step-4 save may be in flight
    killed = subprocess.run([*cmd, "--ckpt-every", "2", "--ckpt-dir", str(run_dir)], env=env, capture_output=True,
                            timeout=300, check=False)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = _train("--ckpt-every", "2", "--ckpt-dir", str(run_dir), "--resume")
    start = out["ckpt"]["resumed_from"]
    assert start in (2, 4)
    assert out["result"]["losses"] == plain[start:]  # JSON floats round-trip exactly: bitwise
    assert out["ckpt"]["saved"] == [s for s in (4, 6) if s > start]
    assert _tensor_crcs(run_dir / "step_0000000006") == _tensor_crcs(ref_dir / "step_0000000006")
