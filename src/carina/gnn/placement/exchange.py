"""Peer-to-peer feature exchange that follows the LP's per-path flows hop by hop.

A batch's plan (:class:`~carina.gnn.placement.routes.BatchRoutes`) routes each peer
pair's bytes over one or more paths through the topology; a path may pass through
switches and CPUs (which the transport crosses on its own) and, with relaying, through
other GPUs. :func:`split_legs` cuts each pair's rows over its paths in proportion to the
LP's amounts (largest remainder, whole rows); :func:`run_legs` then executes every leg as
staged point-to-point rounds: in round ``h`` each leg's ``h``-th hop is sent, from the
holder (round 0) or from the relaying rank that received it in the round before. Each
rank logs the bytes it sends on every physical link of its hops, so the sum over ranks
is, link by link, the plan's flow rounded to whole rows::

    legs = split_legs(routes, gpus, counts, sources, row_bytes)
    got = run_legs(legs, me, want_from, serve, dim, dtype, link_bytes, group)
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from carina.core.errors import ConfigError
from carina.gnn.placement.routes import BatchRoutes
from carina.gnn.placement.topology import NodeKind, Topology

__all__ = ["Leg", "digest", "link_key", "plan_link_bytes", "run_legs", "split_legs"]


@dataclass(frozen=True)
class Leg:
    """Rows ``[offset, offset + rows)`` of what ``dst`` asks of ``src``, carried along one path.

    Attributes:
        src: Rank holding the rows.
        dst: Rank that wants them.
        ranks: Ranks along the path (``src``, relays, ``dst``).
        hops: Physical links of each hop between consecutive ranks.
        rows: Rows on this path.
        offset: First row (in ``dst``'s request order to ``src``) on this path.
    """

    src: int
    dst: int
    ranks: tuple[int, ...]
    hops: tuple[tuple[tuple[str, str], ...], ...]
    rows: int
    offset: int


def link_key(link: tuple[str, str]) -> str:
    """``"a->b"``: a JSON-friendly name of a directed link."""
    return f"{link[0]}->{link[1]}"


def _rank_hops(path: list[str], rank_of: dict[str, int], topo: Topology) -> tuple[tuple[int, ...], tuple]:
    """Cut ``path`` at its GPUs: ranks along it and the physical links of each hop."""
    cuts = [i for i, node in enumerate(path) if topo.nodes[node].kind is NodeKind.GPU]
    missing = [path[i] for i in cuts if path[i] not in rank_of]
    if missing:
        raise ConfigError(f"route {path} passes through GPUs {missing} that no rank runs", key="gpus")
    ranks = tuple(rank_of[path[i]] for i in cuts)
    hops = tuple(tuple(itertools.pairwise(path[a : b + 1])) for a, b in itertools.pairwise(cuts))
    return ranks, hops


def _shares(n: int, amounts: list[float]) -> list[int]:
    """``n`` rows split in proportion to ``amounts`` by largest remainder (ties to the first path)."""
    total = sum(amounts)
    exact = [n * a / total for a in amounts]
    base = [int(np.floor(x)) for x in exact]
    for i in sorted(range(len(amounts)), key=lambda i: (base[i] - exact[i], i))[: n - sum(base)]:
        base[i] += 1
    return base


def split_legs(
    routes: BatchRoutes, topo: Topology, gpus: list[str], counts: np.ndarray, sources: list[str]
) -> list[Leg]:
    """Every peer pair's rows cut over its LP paths, in a rank-independent order."""
    rank_of = {g: r for r, g in enumerate(gpus)}
    paths = routes.schedule.routes()
    legs: list[Leg] = []
    for dst, gpu in enumerate(gpus):
        for src, peer in enumerate(gpus):
            n = int(counts[dst, sources.index(peer)])
            if src == dst or n == 0:
                continue
            pair = paths.get((peer, gpu), [])
            if not pair:
                raise ConfigError(f"plan has no route from {peer} to {gpu} for {n} rows", key="routes")
            offset = 0
            for (path, _), rows in zip(pair, _shares(n, [a for _, a in pair]), strict=True):
                if rows:
                    ranks, hops = _rank_hops(path, rank_of, topo)
                    legs.append(Leg(src=src, dst=dst, ranks=ranks, hops=hops, rows=rows, offset=offset))
                    offset += rows
    return legs


def plan_link_bytes(legs: list[Leg], row_bytes: int) -> dict[str, int]:
    """Bytes the legs put on each physical link (the LP's peer flows in whole rows)."""
    out: dict[str, int] = {}
    for leg in legs:
        for hop in leg.hops:
            for link in hop:
                out[link_key(link)] = out.get(link_key(link), 0) + leg.rows * row_bytes
    return out


def digest(legs: list[Leg]) -> int:
    """A 63-bit fingerprint of the legs: every rank must have solved the same plan."""
    text = repr([(x.src, x.dst, x.ranks, x.rows, x.offset) for x in legs]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def run_legs(
    legs: list[Leg],
    me: int,
    serve: Callable[[int, int, int], torch.Tensor],
    shape: tuple[int, torch.dtype],
    link_bytes: dict[str, int],
    group: Any = None,
) -> dict[int, list[tuple[int, torch.Tensor]]]:
    """Execute the legs in staged point-to-point rounds; return what ``me`` received, per source rank.

    Args:
        legs: From :func:`split_legs` (the same list on every rank).
        me: This rank.
        serve: ``serve(dst, offset, rows)``: rows ``[offset, offset + rows)`` of what rank
            ``dst`` asked of ``me``, from ``me``'s cache.
        shape: Feature width and dtype of a row.
        link_bytes: Updated with the bytes ``me`` sends on each physical link.
        group: The process group (gloo).

    Returns:
        ``{src: [(offset, rows tensor), ...]}`` for the legs ending at ``me``.
    """
    import torch.distributed as dist

    dim, dtype = shape
    held: dict[int, torch.Tensor] = {}  # leg index -> rows this rank holds for it now
    got: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for h in range(max((len(x.hops) for x in legs), default=0)):
        works: list[Any] = []
        recvs: dict[int, torch.Tensor] = {}
        for i, leg in enumerate(legs):
            if h >= len(leg.hops):
                continue
            sender, receiver = leg.ranks[h], leg.ranks[h + 1]
            if sender == me:
                rows = serve(leg.dst, leg.offset, leg.rows) if h == 0 else held.pop(i)
                works.append(dist.isend(rows.contiguous(), receiver, group=group, tag=i))
                for link in leg.hops[h]:
                    key = link_key(link)
                    link_bytes[key] = link_bytes.get(key, 0) + rows.numel() * rows.element_size()
            elif receiver == me:
                recvs[i] = torch.empty(leg.rows, dim, dtype=dtype)
                works.append(dist.irecv(recvs[i], sender, group=group, tag=i))
        for w in works:
            w.wait()
        for i, rows in recvs.items():
            leg = legs[i]
            if leg.dst == me:
                got.setdefault(leg.src, []).append((leg.offset, rows))
            else:
                held[i] = rows  # relay it in the next round
    return got
