"""Restore at another world size: FSDP2 and 2-D DTensor state saved by 4 gloo ranks, restored by 2, and back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ckpt_reshard_worker import worker
from ckpt_state import run_ranks
from typer.testing import CliRunner

from carina.ckpt.cli import app as cli_app
from carina.ckpt.manifest import Manifest, ShardEntry, TensorEntry, parse_manifest
from carina.ckpt.reshard import assemble, plan_reads
from carina.core.errors import CheckpointError, CorruptCheckpoint


@pytest.mark.slow
def test_save_4_restore_2_and_back(tmp_path: Path) -> None:
    assert run_ranks(worker, lambda r: (r, str(tmp_path)), 4) == [0, 0, 0, 0]
    verdicts = json.loads((tmp_path / "verdict.json").read_text())
    assert [v["equal_2to4"] for v in verdicts] == [True] * 4
    assert [v["step_2to4"] for v in verdicts] == [2] * 4
    assert [v["rank_2to4"] for v in verdicts] == [0, 1, 0, 1]  # rank-local state from rank mod 2
    assert [v.get("equal_4to2") for v in verdicts] == [True, True, None, None]
    assert [v.get("step_4to2") for v in verdicts] == [1, 1, None, None]
    assert [v.get("rank_4to2") for v in verdicts] == [0, 1, None, None]
    m = json.loads((tmp_path / "ck4" / "step_0000000001" / "manifest.json").read_text())
    pieces = {s["rank"]: t for s in m["shards"] for t in s["tensors"] if t["name"] == "model/2.weight"}
    assert {r: (t["shape"], t["global_offset"]) for r, t in pieces.items()} == {
        0: ([1, 6], [0, 0]), 1: ([1, 6], [1, 0]), 2: ([1, 6], [2, 0]), 3: ([0, 6], [3, 0])
    }  # fmt: skip
    assert {t["global_shape"] == [3, 6] for t in pieces.values()} == {True}
    res = CliRunner().invoke(cli_app, ["inspect", str(tmp_path / "ck4"), "--json"])
    assert res.exit_code == 0, res.output
    rows = [r for r in json.loads(res.output)["tensors"] if r["name"] == "extras/grid"]
    assert sorted(r["piece"] for r in rows) == [f"at [{r}, {c}] of [7, 5]" for r in (0, 4) for c in (0, 3)]


def _manifest(boxes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> Manifest:
    shards = []
    for rank, (offset, shape) in boxes.items():
        n = shape[0] * shape[1] * 4
        t = TensorEntry("w", "F32", shape, 0, n, 0, (4, 4), offset)
        shards.append(ShardEntry(rank, f"rank{rank:05d}.safetensors", 4096 + n, 4096, 0, (t,)))
    return Manifest(step=1, world_size=len(boxes), shards=tuple(shards))


def test_assemble_crosses_piece_borders() -> None:
    full = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    boxes = {0: ((0, 0), (2, 4)), 1: ((2, 0), (2, 4))}
    m = _manifest(boxes)
    read = {r: {"w": full[o[0] : o[0] + s[0], o[1] : o[1] + s[1]]} for r, (o, s) in boxes.items()}
    want = ((1, 1), (2, 3))  # straddles both row pieces
    assert plan_reads(m, {"w": want}, rank=0) == {0, 1}
    assert plan_reads(m, {"w": ((0, 0), (1, 4))}, rank=1) == {0, 1}  # source rank 1 always read
    assert plan_reads(m, {"w": ((3, 0), (0, 4))}, rank=0) == {0}  # an empty box needs nothing
    out = assemble(m, "w", want, 0, read.__getitem__)
    assert torch.equal(out, full[1:3, 1:4])


def test_assemble_refuses_a_hole() -> None:
    m = _manifest({0: ((0, 0), (1, 4)), 1: ((2, 0), (2, 4))})  # row 1 was never saved
    read = {0: {"w": torch.zeros(1, 4)}, 1: {"w": torch.zeros(2, 4)}}
    with pytest.raises(CheckpointError, match="cover 12 of the 16"):
        assemble(m, "w", ((0, 0), (4, 4)), 0, read.__getitem__)


def test_manifest_global_fields_checked() -> None:
    text = _manifest({0: ((0, 0), (2, 4)), 1: ((2, 0), (2, 4))}).to_json()
    assert parse_manifest(text).shards[1].tensors[0].global_offset == (2, 0)
    bad = json.loads(text)
    bad["shards"][1]["tensors"][0]["global_offset"] = [3, 0]  # rows 3..4 of a 4-row tensor
    with pytest.raises(CorruptCheckpoint, match="outside its global shape"):
        parse_manifest(json.dumps(bad))
    del bad["shards"][1]["tensors"][0]["global_shape"]
    with pytest.raises(CorruptCheckpoint, match="global_shape"):
        parse_manifest(json.dumps(bad))


def test_single_process_checkpoint_into_fsdp2(tmp_path: Path) -> None:
    """A plain (unsharded) checkpoint restores into an FSDP2 model and a fresh optimizer (one gloo rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from carina.ckpt import Checkpointer, Config

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 2))
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    plain(torch.randn(3, 8)).sum().backward()
    opt.step()
    with Checkpointer(Config(dir=str(tmp_path / "ck"), writer="sync")) as ckpt:
        ckpt.save(1, {"model": plain, "optim": opt})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        fresh = torch.optim.AdamW(model.parameters(), lr=1e-2)
        assert (
            Checkpointer(Config(dir=str(tmp_path / "ck"), writer="sync")).restore({"model": model, "optim": fresh}) == 1
        )
        for k, v in plain.state_dict().items():
            assert torch.equal(model.state_dict()[k].full_tensor(), v), k
        state = fresh.state_dict()["state"]
        assert isinstance(state[0]["exp_avg"], DTensor)
        assert torch.equal(state[0]["exp_avg"].full_tensor(), opt.state_dict()["state"][0]["exp_avg"])
    finally:
        dist.destroy_process_group()
