"""A fluid link-sharing simulator that executes transfer plans on a topology.

Each transfer moves ``gb`` along a path of nodes. At every instant the links'
bandwidth is shared by weighted max-min fairness (progressive filling): with
``Sharing.WEIGHTED`` a transfer's weight is its size, so the LP's path flows all
finish together at the LP's time; ``Sharing.FAIR`` gives every transfer the same
weight, like competing DMA engines or TCP flows. The simulation advances from
one completion to the next, so it is exact for piecewise-constant rates::

    sim = simulate(topo, transfers_from(schedule))
    sim.makespan_s        # == schedule.time_s (within rounding)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from carina.core.errors import ConfigError
from carina.gnn.placement.schedule import Demand, Schedule
from carina.gnn.placement.topology import NodeKind, Topology

__all__ = ["SimResult", "Sharing", "Transfer", "shortest_path_transfers", "simulate", "transfers_from"]

_EPS = 1e-12


class Sharing(enum.Enum):
    """How concurrent transfers split a link."""

    WEIGHTED = "weighted"
    FAIR = "fair"


@dataclass
class Transfer:
    """``gb`` along ``path`` (node names, source first)."""

    path: list[str]
    gb: float


@dataclass
class SimResult:
    """When each transfer finished, and the last of them (all ``simulated``)."""

    finish_s: list[float]
    makespan_s: float
    events: int


def transfers_from(schedule: Schedule) -> list[Transfer]:
    """The LP's flows as path transfers."""
    return [Transfer(path, gb) for paths in schedule.routes().values() for path, gb in paths]


def shortest_path_transfers(topo: Topology, demands: list[Demand]) -> list[Transfer]:
    """Naive routing: every demand on its fewest-hop path (no transit through endpoints)."""
    import networkx as nx

    endpoints = {NodeKind.GPU, NodeKind.SSD, NodeKind.DRAM, NodeKind.NIC}
    out = []
    for d in demands:
        if d.src == d.gpu or d.gb <= 0:
            continue
        g = nx.DiGraph()
        for link in topo.links:
            blocked_src = topo.nodes[link.src].kind in endpoints and link.src != d.src
            blocked_dst = topo.nodes[link.dst].kind in endpoints and link.dst != d.gpu
            if not (blocked_src or blocked_dst):
                g.add_edge(link.src, link.dst)
        out.append(Transfer(nx.shortest_path(g, d.src, d.gpu), d.gb))
    return out


def _rates(active: list[int], paths: list[list[tuple[str, str]]], weights: list[float], cap: dict) -> dict[int, float]:
    """Weighted max-min fair rates by progressive filling."""
    left = dict(cap)
    rate: dict[int, float] = {}
    todo = set(active)
    while todo:
        load: dict[tuple[str, str], float] = {}
        for i in todo:
            for e in paths[i]:
                load[e] = load.get(e, 0.0) + weights[i]
        bottleneck = min(load, key=lambda e: left[e] / load[e])
        level = left[bottleneck] / load[bottleneck]
        frozen = [i for i in todo if bottleneck in paths[i]]
        for i in frozen:
            rate[i] = weights[i] * level
            for e in paths[i]:
                left[e] = max(0.0, left[e] - rate[i])
            todo.discard(i)
    return rate


def simulate(topo: Topology, transfers: list[Transfer], *, sharing: Sharing = Sharing.WEIGHTED) -> SimResult:
    """Run ``transfers`` concurrently from time 0 and report their finish times.

    Raises:
        ConfigError: A path uses a link the topology lacks.
    """
    cap = {(x.src, x.dst): x.gbps for x in topo.links}
    paths = []
    for t in transfers:
        edges = list(zip(t.path, t.path[1:], strict=False))
        for e in edges:
            if e not in cap:
                raise ConfigError(f"path uses missing link {e[0]}->{e[1]}", key="path")
        paths.append(edges)
    left = [t.gb for t in transfers]
    weights = [max(t.gb, _EPS) if sharing is Sharing.WEIGHTED else 1.0 for t in transfers]
    finish = [0.0] * len(transfers)
    active = [i for i, t in enumerate(transfers) if t.gb > _EPS and paths[i]]
    now, events = 0.0, 0
    while active:
        rate = _rates(active, paths, weights, cap)
        dt = min(left[i] / rate[i] for i in active)
        now += dt
        events += 1
        still = []
        for i in active:
            left[i] -= rate[i] * dt
            if left[i] <= 1e-9 * max(1.0, transfers[i].gb):
                finish[i] = now
            else:
                still.append(i)
        active = still
    return SimResult(finish_s=finish, makespan_s=max(finish, default=0.0), events=events)
