"""Two gloo ranks checkpointing to a real S3 endpoint (moto's server on loopback) through s3fs.

Each rank uploads its own shard; rank 0 writes the manifest only once every
shard object is in the bucket. Restored bitwise at the same world size (each
rank reading from the bucket alone) and at world size 1 (resharded to whole
tensors); a failed or killed upload of one rank leaves no manifest, and restore
selects the previous checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_remote_worker import worker
from ckpt_state import assert_bitwise, run_ranks, s3_options, tensors_of

from carina.ckpt import Checkpointer, Config
from carina.ckpt.commit import committed_steps
from carina.ckpt.remote import RemoteStore


def _run(tmp: Path, url: str, endpoint: str, scenario: str) -> list[int | None]:
    return run_ranks(worker, lambda r: (r, str(tmp), url, endpoint, scenario), 2)


def _solo_restore(tmp: Path, url: str, endpoint: str) -> tuple[int, dict[str, torch.Tensor], Any]:
    """One process, plain (unsharded) model: restore from the bucket alone into whole tensors."""
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    state: dict[str, Any] = {"model": model, "optim": torch.optim.AdamW(model.parameters(), lr=1e-2), "extras": None}
    config = Config(dir=str(tmp / "solo"), remote=url, remote_options=s3_options(endpoint))
    with Checkpointer(config) as ckpt:
        step = ckpt.restore(state)
    got = tensors_of(state)
    got["grid"] = state["extras"]["grid"]
    return step, got, state["extras"]


def _objects(store: RemoteStore, step: int) -> list[str]:
    store.fs.invalidate_cache()
    path = f"{store.root}/step_{step:010d}"
    return sorted(p.rsplit("/", 1)[-1] for p in store.fs.ls(path, detail=False)) if store.fs.exists(path) else []


@pytest.mark.slow
def test_two_ranks_to_s3_restore_at_2_and_1(
    tmp_path: Path, bucket_url: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(tmp_path, bucket_url, s3_endpoint, "roundtrip") == [0, 0]
    verdicts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(v["step"], v["equal"], v["rank"]) for v in verdicts] == [(2, True, 0), (2, True, 1)]
    assert [v["local"] for v in verdicts] == [[], []]  # read from the bucket, nothing written locally
    assert all("ranks selected different checkpoints" in v["disagree"] and "[1, 2]" in v["disagree"] for v in verdicts)
    assert [v["unchanged"] for v in verdicts] == [True, True]
    store = RemoteStore(bucket_url, s3_options(s3_endpoint))
    assert store.committed_steps() == [1, 2]
    m = store.read_manifest(2)
    assert m.world_size == 2 and [s.rank for s in m.shards] == [0, 1] and m.attempt
    assert _objects(store, 2) == sorted(["manifest.json", *(s.file for s in m.shards)])
    local = tmp_path / "ck" / "step_0000000002" / "rank00001.safetensors"
    assert store.fs.cat_file(f"{store.root}/step_0000000002/{m.shards[1].file}") == local.read_bytes()
    # World size 1: the 2-rank checkpoint resharded into whole tensors, every checksum verified first.
    step, got, extras = _solo_restore(tmp_path, bucket_url, s3_endpoint)
    assert step == 2 and extras["rank"] == 0
    assert_bitwise(got, torch.load(tmp_path / "saved2.pt"))
    # The CLI on the multi-shard remote checkpoints.
    from typer.testing import CliRunner

    from carina.ckpt.cli import app

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    runner = CliRunner()
    rows = json.loads(runner.invoke(app, ["ls", bucket_url, "--json"]).output)
    assert [(r["step"], r["world_size"], r["latest"]) for r in rows] == [(1, 2, False), (2, 2, True)]
    res = runner.invoke(app, ["verify", bucket_url, "--json"])
    assert res.exit_code == 0 and [r["ok"] for r in json.loads(res.output)] == [True, True], res.output
    out = json.loads(runner.invoke(app, ["inspect", bucket_url, "--json"]).output)
    assert {t["rank"] for t in out["tensors"]} == {0, 1} and out["world_size"] == 2
    res = runner.invoke(app, ["prune", bucket_url, "--keep", "1", "--json"])
    assert json.loads(res.output)["removed"] == ["step_0000000001"] and _objects(store, 1) == []


@pytest.mark.slow
def test_one_rank_failing_or_killed_before_upload_writes_no_manifest(
    tmp_path: Path, bucket_url: str, s3_endpoint: str
) -> None:
    codes = _run(tmp_path, bucket_url, s3_endpoint, "faults")
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert codes == [0, -9], (rank0, rank1)  # rank 1 SIGKILLed at step 3
    assert "upload of step 2 failed: injected" in rank1["error2"]
    assert "ranks [1] did not upload their shards" in rank0["error2"]
    assert "ranks [1] did not upload their shards" in rank0["error3"]
    assert committed_steps(str(tmp_path / "ck")) == [1, 2, 3]  # every local commit happened
    store = RemoteStore(bucket_url, s3_options(s3_endpoint))
    assert store.committed_steps() == [1] and [c.step for c in store.list()] == [1]
    for step in (2, 3):  # rank 0's shard object only: debris, never selected
        objects = _objects(store, step)
        assert len(objects) == 1 and objects[0].startswith("rank00000."), objects
    step, got, _ = _solo_restore(tmp_path, bucket_url, s3_endpoint)
    assert step == 1
    assert_bitwise(got, torch.load(tmp_path / "saved1.pt"))
