"""Crash injection: kill the writer or the trainer at every phase of the save pipeline."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ckpt_state import assert_bitwise, make_state, tensors_of

from carina.ckpt import Checkpointer, Config, WriterKind, verify
from carina.ckpt import commit as commit_mod
from carina.ckpt.commit import PHASES, committed_steps, step_dir_name
from carina.ckpt.storage import select
from carina.core.errors import CheckpointError
from carina.testing.ckpt import crash_at

# Where restore must land when the save of step 2 dies at each phase: the new
# checkpoint counts only once `latest` names it (or, failing that, it is the newest committed).
_COMMITTED_AT = PHASES.index("latest")


def _expected(phase: str) -> int:
    return 2 if PHASES.index(phase) >= _COMMITTED_AT else 1


def _check_every_committed_loads(root: Path) -> None:
    for step in committed_steps(str(root)):
        verify(str(root / step_dir_name(step)))  # zero bad selections: all committed verify


@pytest.mark.parametrize("phase", PHASES)
def test_writer_killed_at_phase(tmp_path: Path, phase: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_mod, "fault_hook", None)
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.FORK, keep_last=0)) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        good = tensors_of(state)
        state["optim"].step()
        newer = tensors_of(state)
        crash_at(phase, 2, "writer")  # the fork child running step 2 SIGKILLs itself
        ckpt.save(2, state)
        with pytest.raises(CheckpointError, match="SIGKILL"):
            ckpt.wait()
        commit_mod.fault_hook = None
        _check_every_committed_loads(tmp_path)
        fresh = make_state(5)
        assert ckpt.restore(fresh) == _expected(phase)
        assert_bitwise(tensors_of(fresh), newer if _expected(phase) == 2 else good)
        ckpt.save(3, state)  # the writer keeps working after a failure
        ckpt.wait()
        assert ckpt.restore(make_state(5)) == 3


def _trainer(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "carina.testing.ckpt", "--model", "mlp", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = _trainer(["--dir", str(tmp_path_factory.mktemp("ref")), "--steps", "6", "--writer", "sync"])
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("phase", ["data_chunk", "manifest", "rename", "latest"])
def test_trainer_killed_at_phase_then_resumes_bitwise(tmp_path: Path, phase: str, reference: dict) -> None:
    d = str(tmp_path)
    crashed = _trainer(["--dir", d, "--steps", "6", "--writer", "thread", "--crash-phase", phase, "--crash-step", "4",
                        "--crash-target", "trainer"])  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    _check_every_committed_loads(tmp_path)
    assert select(d).manifest.step == (4 if PHASES.index(phase) >= _COMMITTED_AT else 2)
    resumed = _trainer(["--dir", d, "--steps", "6", "--writer", "fork", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["losses"] == reference["losses"][out["start"] :]  # type: ignore[index]
    assert out["params_sha256"] == reference["params_sha256"]


@pytest.mark.parametrize("seed", range(2))
def test_sigkill_at_random_moments(tmp_path: Path, seed: int) -> None:
    """Kill trainer and writer children together at a random time; restore must pick a good one."""
    rng = random.Random(seed)
    cmd = [sys.executable, "-m", "carina.testing.ckpt", "--model", "mlp", "--dir", str(tmp_path),
           "--steps", "400", "--save-every", "1", "--writer", "fork"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while not committed_steps(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    steps = committed_steps(str(tmp_path))
    assert steps, "no checkpoint committed before the kill"
    _check_every_committed_loads(tmp_path)
    loaded = select(str(tmp_path))
    assert loaded.manifest.step in steps
    assert torch.isfinite(loaded.tensors["model/emb.weight"]).all()


@pytest.mark.parametrize("seed", range(6))
def test_writer_child_killed_at_random_moment(tmp_path: Path, seed: int) -> None:
    """SIGKILL the fork child at a random moment of a 16 MiB save: the previous checkpoint stays selected."""
    rng = random.Random(seed)
    state = {**make_state(0), "blob": torch.randn(4 << 20)}
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.FORK, keep_last=0)) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        saved = {1: state["blob"].clone()}
        state["blob"].add_(1.0)
        saved[2] = state["blob"].clone()
        ckpt.save(2, state)
        child = ckpt._writer._child  # type: ignore[attr-defined]
        assert child is not None
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(child[0], signal.SIGKILL)
        try:
            ckpt.wait()  # raises unless the child won the race
        except CheckpointError as exc:
            assert "SIGKILL" in str(exc)
        _check_every_committed_loads(tmp_path)
        fresh = {**make_state(3), "blob": None}
        step = ckpt.restore(fresh)
        assert step in committed_steps(str(tmp_path))
        assert torch.equal(fresh["blob"], saved[step])
