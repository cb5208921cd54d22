from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_state import make_state
from typer.testing import CliRunner

from carina.ckpt import Checkpointer, Config, WriterKind
from carina.ckpt.cli import app
from carina.core.errors import CheckpointError

runner = CliRunner()


@pytest.fixture
def ckpt_dir(tmp_path: Path) -> Path:
    state = make_state(0)
    with Checkpointer(Config(dir=str(tmp_path), writer=WriterKind.SYNC, keep_last=0)) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, state)
    return tmp_path


def test_ls_json(ckpt_dir: Path) -> None:
    res = runner.invoke(app, ["ls", str(ckpt_dir), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["latest"] for r in rows] == [False, False, True]
    assert all(r["bytes"] > 4096 and r["error"] == "" for r in rows)


def test_verify_and_corruption(ckpt_dir: Path) -> None:
    res = runner.invoke(app, ["verify", str(ckpt_dir), "--json"])
    assert res.exit_code == 0, res.output
    assert all(r["ok"] for r in json.loads(res.output))
    shard = ckpt_dir / "step_0000000002" / "rank00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    res = runner.invoke(app, ["verify", str(ckpt_dir), "--json"])
    assert res.exit_code == 1
    rows = {r["step"]: r for r in json.loads(res.output)}
    assert rows[2]["ok"] is False and "checksum mismatch" in rows[2]["error"]
    assert rows[1]["ok"] and rows[3]["ok"]


def test_inspect(ckpt_dir: Path) -> None:
    res = runner.invoke(app, ["inspect", str(ckpt_dir), "--step", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    names = {t["name"]: t for t in out["tensors"]}
    assert out["step"] == 1 and names["model/0.weight"]["shape"] == [32, 16]
    assert names["model/0.weight"]["dtype"] == "F32" and names["model/0.weight"]["bytes"] == 32 * 16 * 4


def test_prune(ckpt_dir: Path) -> None:
    (ckpt_dir / "step_0000000000.abc123.tmp").mkdir()  # debris of a crashed save
    res = runner.invoke(app, ["prune", str(ckpt_dir), "--keep", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["removed"] == ["step_0000000000.abc123.tmp", "step_0000000001", "step_0000000002"]
    res = runner.invoke(app, ["ls", str(ckpt_dir), "--json"])
    assert [r["step"] for r in json.loads(res.output)] == [3]


@pytest.mark.parametrize("command", ["ls", "verify", "inspect", "prune"])
def test_missing_directory_is_an_error_naming_it(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "typo"
    res = runner.invoke(app, [command, str(missing)])
    assert isinstance(res.exception, CheckpointError), res.output
    assert "not a checkpoint directory" in str(res.exception)
    assert res.exception.context["path"] == str(missing)
    assert not missing.exists()


def test_verify_of_an_empty_directory_fails(tmp_path: Path) -> None:
    res = runner.invoke(app, ["verify", str(tmp_path)])
    assert isinstance(res.exception, CheckpointError) and "no committed checkpoint" in str(res.exception)


def test_cli_has_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys; from carina.ckpt import cli, remote, storage; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bench_json(tmp_path: Path) -> None:
    res = runner.invoke(app, ["bench", "--size-mb", "2", "--reps", "1", "--writers", "thread,sync", "--dir",
                              str(tmp_path), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in json.loads(res.output)}
    assert set(rows) == {"carina-thread", "carina-sync", "torch.save"}
    # durable once latest names the save; done after retention too (the sync writer is durable inside save())
    assert all(r["done_s"] >= max(r["durable_s"], r["blocking_s"]) and r["durable_s"] > 0 for r in rows.values())
    assert list(tmp_path.iterdir()) == []  # cleans up after itself
