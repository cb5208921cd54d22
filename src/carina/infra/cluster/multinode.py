"""Pairwise and ring bandwidth between nodes over torch.distributed, naming the slow node or link.

Every rank calls :func:`pairwise_bandwidth` / :func:`ring_bandwidth` in one process
group (``env://`` under torchrun, or a hostfile); rank 0 gets the table. A link whose
bandwidth is a robust outlier below the median names its two ends; a node all of whose
links are slow is named as the slow node.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Any

from carina.infra.cluster.checks.base import fleet_outliers

__all__ = ["find_slow", "pairwise_bandwidth", "ring_bandwidth"]


def _exchange(peer: int, rank: int, tensor: Any, scratch: Any) -> None:
    import torch.distributed as dist

    if rank < peer:
        dist.send(tensor, peer)
        dist.recv(scratch, peer)
    else:
        dist.recv(scratch, peer)
        dist.send(tensor, peer)


def pairwise_bandwidth(nbytes: int = 1 << 24, iters: int = 3, device: str = "cpu") -> dict[str, float]:
    """Bandwidth (GB/s, one direction) of every pair of ranks, measured one pair at a time.

    Returns on rank 0 ``{"i-j": GB/s}``; other ranks get an empty dict.
    """
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    tensor = torch.ones(nbytes // 4, device=device)
    scratch = torch.empty_like(tensor)
    results: dict[str, float] = {}
    for i in range(world):
        for j in range(i + 1, world):
            dist.barrier()
            seconds = torch.zeros(1, dtype=torch.float64)
            if rank in (i, j):
                peer = j if rank == i else i
                _exchange(peer, rank, tensor, scratch)  # warm-up
                start = time.perf_counter()
                for _ in range(iters):
                    _exchange(peer, rank, tensor, scratch)
                seconds[0] = (time.perf_counter() - start) / iters
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            results[f"{i}-{j}"] = 2 * nbytes / float(seconds[0]) / 1e9
    return results if rank == 0 else {}


def ring_bandwidth(nbytes: int = 1 << 24, iters: int = 3, device: str = "cpu") -> dict[str, float]:
    """Every rank sends to the next and receives from the previous at once; GB/s per ring link on rank 0."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    tensor = torch.ones(nbytes // 4, device=device)
    scratch = torch.empty_like(tensor)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        reqs = [dist.isend(tensor, nxt), dist.irecv(scratch, prv)]
        for req in reqs:
            if req is not None:
                req.wait()
    mine = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return {f"{r}-{(r + 1) % world}": nbytes / float(t) / 1e9 for r, t in enumerate(gathered)} if rank == 0 else {}


def find_slow(links: dict[str, float], *, fraction: float = 0.25, z: float = 3.5) -> dict[str, list[str]]:
    """Slow links and the nodes common to most of them.

    A link is slow below ``fraction`` of the median link (autopilot fails PCIe links at 25%
    of peak) or when it is a robust outlier below the median.
    """
    if len(links) < 3:
        return {"links": [], "nodes": []}
    median = statistics.median(links.values())
    slow_links = sorted(set(fleet_outliers(links, z=z)) | {k for k, v in links.items() if v < fraction * median})
    ends = Counter(end for link in slow_links for end in link.split("-"))
    if not ends:
        return {"links": [], "nodes": []}
    top = max(ends.values())
    nodes = sorted(n for n, c in ends.items() if c == top and c > 1) if len(slow_links) > 1 else []
    return {"links": slow_links, "nodes": nodes}
