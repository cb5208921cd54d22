"""Collective bandwidth sweeps (all-reduce, all-gather, reduce-scatter, all-to-all).

Bandwidths follow nccl-tests' definitions (doc/PERFORMANCE.md): ``algbw = S / t``
with S the total array size, and ``busbw = algbw · factor(n)``, the factor being
2(n−1)/n for all-reduce and (n−1)/n for all-gather, reduce-scatter and all-to-all,
so busbw is comparable with the link's hardware bandwidth whatever n is.

Runs in an existing process group, or spawns one process per local GPU (NCCL) or
several CPU processes (gloo) on loopback.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from carina.core.errors import ValidationFailed

__all__ = ["BUS_FACTOR", "OPS", "bus_bandwidth", "run_local_sweep", "sweep"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _allreduce_factor(n: int) -> float:
    return 2.0 * (n - 1) / n


def _sharded_factor(n: int) -> float:
    return (n - 1) / n


BUS_FACTOR = {
    "all_reduce": _allreduce_factor,
    "all_gather": _sharded_factor,
    "reduce_scatter": _sharded_factor,
    "all_to_all": _sharded_factor,
}


def bus_bandwidth(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s for ``op`` moving an ``nbytes`` array in ``seconds`` on ``world`` ranks."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[op](world)


def _one(op: str, nbytes: int, world: int, rank: int, device: str) -> tuple[Any, Any]:
    """The callable performing ``op`` on an ``nbytes`` array, and a check of its first result."""
    import torch
    import torch.distributed as dist

    elems = max(world, nbytes // 4 // world * world)
    full = torch.full((elems,), float(rank + 1), device=device)
    shard = torch.empty(elems // world, device=device)
    out = torch.empty(elems, device=device)
    expected_sum = world * (world + 1) / 2
    if op == "all_reduce":
        return (lambda: dist.all_reduce(full)), (lambda: _close(full[0], expected_sum, 0))
    if op == "all_gather":
        mine = torch.full((elems // world,), float(rank + 1), device=device)
        return (lambda: dist.all_gather_into_tensor(out, mine)), (lambda: _close(out[-1], world, 0))
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter_tensor(shard, full)), (lambda: _close(shard[0], expected_sum, 0))
    return (lambda: dist.all_to_all_single(out, full)), (lambda: _close(out[-1], world, 0))


def _close(value: Any, expected: float, _: int) -> bool:
    return abs(float(value) - expected) <= 1e-3 * max(1.0, abs(expected))


def sweep(
    sizes: Sequence[int], *, ops: Sequence[str] = OPS, iters: int = 5, device: str = "cpu"
) -> list[dict[str, Any]]:
    """Run each op at each size in the current process group; every rank calls it.

    Returns:
        One row per (op, size): bytes, time, algbw and busbw in GB/s (rank 0's view).

    Raises:
        ValidationFailed: A collective gave a wrong result.
    """
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for op in ops:
        for nbytes in sizes:
            fn, check = _one(op, nbytes, world, rank, device)
            fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if not check():
                raise ValidationFailed(f"{op} gave a wrong result", rank=rank, bytes=nbytes)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / iters
            t = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            algbw, busbw = bus_bandwidth(op, nbytes, float(t), world)
            rows.append({"op": op, "bytes": nbytes, "seconds": float(t), "algbw_gbps": algbw, "busbw_gbps": busbw})
    return rows


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, backend: str, sizes: list[int], iters: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        rows = sweep(sizes, iters=iters, device=device)
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def run_local_sweep(
    world: int, *, backend: str = "gloo", sizes: Sequence[int] = (1 << 20,), iters: int = 5
) -> list[dict[str, Any]]:
    """Spawn ``world`` local processes (one per GPU for NCCL) and sweep the collectives."""
    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (shared hosts)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rows.json")
        mp.spawn(_worker, args=(world, free_port(), backend, list(sizes), iters, out), nprocs=world, join=True)
        return list(json.loads(Path(out).read_text()))
