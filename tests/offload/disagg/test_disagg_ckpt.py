"""PS state checkpointed through carina.ckpt (composed on the CLI floor): kill, restore, continue bitwise."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from carina.ckpt.commit import committed_steps
from carina.cli.train_disagg import run_disagg
from carina.core.errors import ConfigError
from carina.offload.disagg import DisaggConfig, launch
from carina.offload.disagg.control import WorkerDied
from carina.testing.disagg import DIE_AT_STEP, dying_batch

STEPS, EVERY = 6, 2
CFG = DisaggConfig(workers=2, ps_shards=2, device="cpu", lr=1e-2, weight_decay=0.1, step_timeout_s=60)

# Run in a child: SIGKILL the launcher (trainer and thread writer) in the middle of step 4's save.
_KILLED_MID_SAVE = f"""
import os, signal
from pathlib import Path
from carina.ckpt import commit
from carina.cli.train_disagg import run_disagg
from carina.offload.disagg import DisaggConfig

def hook(phase, step):
    if phase == "manifest" and step == 4:  # data and manifest written, not yet renamed into place
        os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    commit.fault_hook = hook
    cfg = DisaggConfig.from_json(os.environ["CFG_JSON"])
    run_disagg(cfg, steps={STEPS}, ckpt_dir=Path(os.environ["CKPT_DIR"]), ckpt_every={EVERY})
"""


@pytest.fixture(scope="module")
def uninterrupted():
    return launch(CFG, steps=STEPS)


def _assert_continues_bitwise(run, uninterrupted, start: int) -> None:
    assert run.start_step == start
    assert run.result.losses == uninterrupted.losses[start:]
    for name, value in uninterrupted.masters.items():
        assert torch.equal(run.result.masters[name], value), name


@pytest.mark.slow
def test_killed_mid_save_then_restored_continues_bitwise(tmp_path, uninterrupted):
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_MID_SAVE)
    ckpt = tmp_path / "ckpt"
    # The killed launcher cannot remove its segment: keep it under tmp_path, not /dev/shm.
    cfg = dataclasses.replace(CFG, shm_dir=tmp_path)
    env = {**os.environ, "CKPT_DIR": str(ckpt), "CFG_JSON": cfg.to_json(), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert committed_steps(str(ckpt)) == [2]
    assert any(p.name.startswith("step_0000000004.") for p in ckpt.iterdir())  # the half-written save is there
    run = run_disagg(CFG, steps=STEPS, ckpt_dir=ckpt, ckpt_every=EVERY)
    _assert_continues_bitwise(run, uninterrupted, start=2)  # ... and never selected
    assert run.saved == [4, 6] and committed_steps(str(ckpt))[-1] == STEPS


@pytest.mark.slow
def test_dead_worker_keeps_last_full_step_checkpoint_and_resumes_bitwise(tmp_path, uninterrupted):
    with pytest.raises(WorkerDied) as info:
        run_disagg(CFG, steps=STEPS, ckpt_dir=tmp_path, ckpt_every=EVERY, batch_fn=dying_batch)
    assert info.value.context["step"] == DIE_AT_STEP == 2
    assert committed_steps(str(tmp_path)) == [2]
    run = run_disagg(CFG, steps=STEPS, ckpt_dir=tmp_path, ckpt_every=EVERY)
    _assert_continues_bitwise(run, uninterrupted, start=2)
    again = run_disagg(CFG, steps=STEPS, ckpt_dir=tmp_path, ckpt_every=EVERY)
    assert again.start_step == STEPS and again.result is None  # already done: nothing retrained


def test_ckpt_every_needs_a_directory(tmp_path: Path):
    with pytest.raises(ConfigError):
        run_disagg(CFG, steps=2, ckpt_every=2)


@pytest.mark.slow
def test_train_cli_disagg_checkpoints_and_resumes(tmp_path):
    import json

    from typer.testing import CliRunner

    from carina.cli.app import app

    args = ["train", "--disagg", "--workers", "2", "--ps-shards", "1", "--device", "cpu", "--lr", "0.01", "--json"]
    ck = ["--ckpt-dir", str(tmp_path), "--ckpt-every", "2"]
    first = CliRunner().invoke(app, [*args, "--steps", "2", *ck])
    assert first.exit_code == 0, first.output
    first_rep = json.loads(first.output)
    assert first_rep["start_step"] == 0 and first_rep["checkpoints"] == [2] and first_rep["steps"] == 2
    assert committed_steps(str(tmp_path)) == [2]
    again = CliRunner().invoke(app, [*args, "--steps", "3", *ck])
    assert again.exit_code == 0, again.output
    rep = json.loads(again.output)
    plain = launch(DisaggConfig(workers=2, ps_shards=1, device="cpu", lr=1e-2), steps=3)  # as the CLI builds it
    assert rep["start_step"] == 2 and rep["steps"] == 3 and rep["checkpoints"] == []
    assert first_rep["losses"] + rep["losses"] == plain.losses  # resumed bitwise
