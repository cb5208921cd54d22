"""One of four spawned gloo ranks: save at 4 ranks, restore at 2, save at 2, restore at 4.

Each phase starts its own process group from a file store (no ports to race
for). The state is an FSDP2 (``fully_shard``) model with AdamW, whose shards are
uneven (6 and 3 rows over 4 ranks: the last rank's piece of the second layer is
empty), plus a 7x5 DTensor sharded over a 2x2 mesh on both dimensions. After
every restore each rank gathers the full tensors and rank 0 writes whether they
are bitwise equal to the ones saved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

_GRID = torch.arange(35, dtype=torch.float32).reshape(7, 5) / 7


def _model(world: int, seed: int) -> tuple[Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _grid(mesh_shape: tuple[int, ...], placements: list[Any]) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(_GRID.clone() + 1000, init_device_mesh("cpu", mesh_shape), placements)


def _full(model: Any, opt: Any, extras: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.full_tensor() for k, v in model.state_dict().items()}
    for pid, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            out[f"optim.{pid}.{k}"] = v.full_tensor() if hasattr(v, "full_tensor") else v
    out["grid"] = extras["grid"].full_tensor()
    return out


def _bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
        for k in a
    )


def _phase(name: str, rank: int, world: int, tmp: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp / ('store_' + name)}", rank=rank, world_size=world)


def worker(rank: int, tmp_dir: str) -> None:
    """Run the three phases; rank 0 writes ``verdict.json`` into ``tmp_dir``."""
    from torch.distributed.tensor import Replicate, Shard

    from carina.ckpt import Checkpointer, Config

    torch.set_num_threads(1)
    tmp = Path(tmp_dir)
    verdict: dict[str, Any] = {}
    # 4 ranks: train one step, save.
    _phase("a", rank, 4, tmp)
    model, opt = _model(4, seed=0)
    model(torch.randn(4, 10, generator=torch.Generator().manual_seed(1))).sum().backward()
    opt.step()
    extras = {"grid": _grid((2, 2), [Shard(0), Shard(1)]), "rank": rank}
    with Checkpointer(Config(dir=str(tmp / "ck4"), writer="thread")) as ckpt:
        ckpt.save(1, {"model": model, "optim": opt, "extras": extras})
        ckpt.wait()
    saved = _full(model, opt, extras)
    dist.destroy_process_group()
    # 2 ranks: a fresh model (other seed) and a fresh optimizer (no state yet) restore the 4-rank checkpoint.
    if rank < 2:
        _phase("b", rank, 2, tmp)
        model, opt = _model(2, seed=5)
        state: dict[str, Any] = {"model": model, "optim": opt, "extras": {"grid": _grid((2,), [Shard(1)])}}
        ckpt = Checkpointer(Config(dir=str(tmp / "ck4"), writer="sync"))
        verdict["step_4to2"] = ckpt.restore(state)
        verdict["equal_4to2"] = _bitwise(_full(model, opt, state["extras"]), saved)
        verdict["rank_4to2"] = state["extras"]["rank"]
        with Checkpointer(Config(dir=str(tmp / "ck2"), writer="thread")) as out:
            out.save(2, state)
            out.wait()
        dist.destroy_process_group()
    # 4 ranks again: restore the 2-rank checkpoint.
    _phase("c", rank, 4, tmp)
    model, opt = _model(4, seed=9)
    state = {"model": model, "optim": opt, "extras": {"grid": _grid((4,), [Replicate()])}}
    verdict["step_2to4"] = Checkpointer(Config(dir=str(tmp / "ck2"), writer="sync")).restore(state)
    verdict["equal_2to4"] = _bitwise(_full(model, opt, state["extras"]), saved)
    verdict["rank_2to4"] = state["extras"]["rank"]
    verdicts: list[Any] = [None] * 4
    dist.all_gather_object(verdicts, verdict)
    if rank == 0:
        (tmp / "verdict.json").write_text(json.dumps(verdicts))
    dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown (gloo threads), the verdict is written
