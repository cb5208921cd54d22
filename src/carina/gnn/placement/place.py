"""Feature placement across GPU caches, host DRAM per socket and SSDs.

Features are cut into chunks (items). Each item has a size and, per GPU, the GB
that GPU reads from it per batch (its hotness). A placement names the store(s)
holding each item; a GPU reads an item from its own cache when it holds a copy,
otherwise from the first holder in :data:`PREFERENCE` order. The objective is
the predicted batch time: the LP transfer time of the demand the placement
induces (:func:`evaluate`).

:func:`place_greedy` is a DDAK-style heuristic: items by traffic, hottest
first, each into the store that keeps the estimated time lowest, where the
estimate is ``max(out_load_s / out_bw_s, in_load_g / in_bw_g)`` with the
bandwidths from single-source / single-sink max-flows on the topology.
:func:`place_exact` solves the same problem exactly as one MILP (assignment
binaries + multi-commodity flows, ``scipy.optimize.milp``); use it on small
instances to measure the heuristic's gap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from carina.core.errors import CapacityError, ConfigError
from carina.gnn.placement.schedule import Demand, Schedule, schedule_lp
from carina.gnn.placement.topology import NodeKind, Topology

__all__ = [
    "PREFERENCE",
    "Items",
    "Placement",
    "demands_of",
    "evaluate",
    "place_exact",
    "place_greedy",
    "replicate_hottest",
    "source_of",
]

#: Where a GPU reads an item it does not hold, best first.
PREFERENCE = (NodeKind.DRAM, NodeKind.SSD, NodeKind.GPU)


@dataclass
class Items:
    """Feature chunks: ``size_gb[i]`` and ``traffic[i, g]`` GB per batch read by GPU ``gpus[g]``."""

    size_gb: np.ndarray
    traffic: np.ndarray
    gpus: list[str]

    def __post_init__(self) -> None:
        if self.traffic.shape != (self.size_gb.size, len(self.gpus)):
            raise ConfigError("traffic must be [items, gpus]", key="traffic")
        if (self.size_gb < 0).any() or (self.traffic < 0).any():
            raise ConfigError("sizes and traffic must be >= 0", key="items")


@dataclass
class Placement:
    """``holders[i]``: the stores holding item ``i`` (one or more)."""

    holders: list[list[str]]

    def load_gb(self, items: Items) -> dict[str, float]:
        """GB stored per store."""
        out: dict[str, float] = defaultdict(float)
        for i, hs in enumerate(self.holders):
            for s in hs:
                out[s] += float(items.size_gb[i])
        return dict(out)


def stores_of(topo: Topology) -> list[str]:
    """Every node that can hold features (GPUs, DRAM, SSDs)."""
    return [n.name for n in topo.nodes.values() if n.kind in (NodeKind.GPU, NodeKind.DRAM, NodeKind.SSD)]


def _source(topo: Topology, holders: list[str], gpu: str) -> str:
    if gpu in holders:
        return gpu
    socket = topo.nodes[gpu].socket
    for kind in PREFERENCE:
        same = [h for h in holders if topo.nodes[h].kind is kind]
        if same:
            near = [h for h in same if topo.nodes[h].socket == socket]
            return (near or same)[0]
    raise ConfigError("an item has no holder", key="holders")


def source_of(topo: Topology, holders: list[str], gpu: str) -> str:
    """Where ``gpu`` reads an item held by ``holders``: its own copy, else by :data:`PREFERENCE`, same socket first."""
    return _source(topo, holders, gpu)


def demands_of(topo: Topology, items: Items, placement: Placement) -> list[Demand]:
    """The (source, GPU, GB) demand a placement induces for one batch."""
    acc: dict[tuple[str, str], float] = defaultdict(float)
    for i, hs in enumerate(placement.holders):
        for g, gpu in enumerate(items.gpus):
            gb = float(items.traffic[i, g])
            if gb > 0:
                acc[(_source(topo, hs, gpu), gpu)] += gb
    return [Demand(s, g, gb) for (s, g), gb in acc.items()]


def evaluate(topo: Topology, items: Items, placement: Placement) -> Schedule:
    """Predicted batch transfer plan of ``placement`` (LP)."""
    return schedule_lp(topo, demands_of(topo, items, placement))


def _capacity(topo: Topology, capacity_gb: dict[str, float] | None) -> dict[str, float]:
    caps = {s: topo.nodes[s].capacity_gb for s in stores_of(topo)}
    caps.update(capacity_gb or {})
    return caps


def _bandwidths(topo: Topology, stores: list[str], gpus: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    import networkx as nx

    g = nx.DiGraph()
    for x in topo.links:
        g.add_edge(x.src, x.dst, capacity=x.gbps)
    for gpu in gpus:
        g.add_edge(gpu, "__sink__", capacity=float("inf"))
    out_bw = {}
    for s in stores:
        if s in g:
            h = g.copy()
            if s in gpus:
                h.remove_edge(s, "__sink__")
            out_bw[s] = nx.maximum_flow_value(h, s, "__sink__") if s in h else 0.0
    in_bw = {}
    for gpu in gpus:
        h = nx.DiGraph()
        h.add_edges_from((x.src, x.dst, {"capacity": x.gbps}) for x in topo.links)
        for s in stores:
            if s != gpu:
                h.add_edge("__src__", s, capacity=float("inf"))
        in_bw[gpu] = nx.maximum_flow_value(h, "__src__", gpu)
    return out_bw, in_bw


def place_greedy(
    topo: Topology,
    items: Items,
    *,
    capacity_gb: dict[str, float] | None = None,
    replicate: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
) -> Placement:
    """DDAK-style greedy placement, with the hottest items optionally replicated on every GPU.

    For each share ``r`` in ``replicate``, the hottest items filling ``r`` of the
    smallest GPU cache are copied to every GPU, the rest are placed greedily in
    the remaining space; the candidate with the lowest LP time wins.
    ``replicate=(0.0,)`` gives the pure single-holder heuristic.

    Raises:
        CapacityError: The stores cannot hold every item.
    """
    caps = _capacity(topo, capacity_gb)
    order = np.argsort(-items.traffic.sum(axis=1), kind="stable")
    gpu_cap = min(caps[g] for g in items.gpus)
    best: tuple[float, Placement] | None = None
    for share in replicate:
        hot, filled = [], 0.0
        for i in order:
            if filled + float(items.size_gb[i]) > share * gpu_cap:
                break
            hot.append(int(i))
            filled += float(items.size_gb[i])
        left = {s: c - (filled if s in items.gpus else 0.0) for s, c in caps.items()}
        rest = np.ones(items.size_gb.size, dtype=bool)
        rest[hot] = False
        sub = Items(items.size_gb[rest], items.traffic[rest], items.gpus)
        placed = _greedy(topo, sub, left).holders
        holders: list[list[str]] = [list(items.gpus) for _ in range(items.size_gb.size)]
        for j, i in enumerate(np.flatnonzero(rest)):
            holders[i] = placed[j]
        cand = Placement(holders)
        t = evaluate(topo, items, cand).time_s
        if best is None or t < best[0] - 1e-12:
            best = (t, cand)
    assert best is not None
    return best[1]


def _greedy(topo: Topology, items: Items, caps: dict[str, float]) -> Placement:
    stores = stores_of(topo)
    out_bw, in_bw = _bandwidths(topo, stores, items.gpus)
    out_load = dict.fromkeys(stores, 0.0)
    in_load = dict.fromkeys(items.gpus, 0.0)
    used = dict.fromkeys(stores, 0.0)
    gidx = {g: k for k, g in enumerate(items.gpus)}
    holders: list[list[str]] = [[] for _ in range(items.size_gb.size)]
    for i in np.argsort(-items.traffic.sum(axis=1), kind="stable"):
        size, traffic = float(items.size_gb[i]), items.traffic[i]
        best, best_cost = None, float("inf")
        for s in stores:
            if used[s] + size > caps[s] + 1e-12 or out_bw.get(s, 0.0) <= 0:
                continue
            local = traffic[gidx[s]] if s in gidx else 0.0
            sent = float(traffic.sum() - local)
            cost = (out_load[s] + sent) / out_bw[s]
            cost = max(cost, *((in_load[g] + traffic[k] * (g != s)) / in_bw[g] for g, k in gidx.items()))
            if cost < best_cost - 1e-15:
                best, best_cost = s, cost
        if best is None:
            raise CapacityError("stores cannot hold every item", item=int(i), size_gb=size)
        holders[i] = [best]
        used[best] += size
        out_load[best] += float(traffic.sum() - (traffic[gidx[best]] if best in gidx else 0.0))
        for g, k in gidx.items():
            if g != best:
                in_load[g] += float(traffic[k])
    return Placement(holders)


def replicate_hottest(topo: Topology, items: Items, *, capacity_gb: dict[str, float] | None = None) -> Placement:
    """Naive baseline: every GPU caches the same hottest items; the rest striped over DRAM, then SSDs."""
    caps = _capacity(topo, capacity_gb)
    gpu_cap = min(caps[g] for g in items.gpus)
    order = np.argsort(-items.traffic.sum(axis=1), kind="stable")
    holders: list[list[str]] = [[] for _ in range(items.size_gb.size)]
    used = dict.fromkeys(caps, 0.0)
    others = [s for s in caps if topo.nodes[s].kind is NodeKind.DRAM] + [
        s for s in caps if topo.nodes[s].kind is NodeKind.SSD
    ]
    filled, turn = 0.0, 0
    for i in order:
        size = float(items.size_gb[i])
        if filled + size <= gpu_cap:
            holders[i] = list(items.gpus)
            filled += size
            continue
        # stripe the rest round-robin over DRAM (sockets) first, then over the SSDs
        tier = [s for s in others if used[s] + size <= caps[s]]
        if not tier:
            raise CapacityError("stores cannot hold every item", item=int(i))
        kind = topo.nodes[tier[0]].kind
        same = [s for s in tier if topo.nodes[s].kind is kind]
        home = same[turn % len(same)]
        turn += 1
        holders[i] = [home]
        used[home] += size
    return Placement(holders)


def place_exact(
    topo: Topology, items: Items, *, capacity_gb: dict[str, float] | None = None
) -> tuple[Placement, float]:
    """Optimal single-holder placement and its time, by MILP (small instances only)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    from carina.gnn.placement.schedule import _allowed

    stores, caps = stores_of(topo), _capacity(topo, capacity_gb)
    kinds = {n.name: n.kind for n in topo.nodes.values()}
    n_items, nodes = items.size_gb.size, {v: j for j, v in enumerate(topo.nodes)}
    pairs = [(s, g) for s in stores for g in items.gpus if s != g]
    x0 = 0
    fvars = [(k, e) for k, (s, g) in enumerate(pairs) for e, x in enumerate(topo.links) if _allowed(x, s, g, kinds)]
    f0 = n_items * len(stores)
    nv = f0 + len(fvars) + 1
    rows = len(pairs) * len(nodes) + len(topo.links) + n_items + len(stores)
    a = lil_matrix((rows, nv))
    lo, hi = np.zeros(rows), np.zeros(rows)
    for j, (k, e) in enumerate(fvars):  # conservation: out - in - supplied(x) = 0
        link = topo.links[e]
        a[k * len(nodes) + nodes[link.src], f0 + j] += 1.0
        a[k * len(nodes) + nodes[link.dst], f0 + j] -= 1.0
    for k, (s, g) in enumerate(pairs):
        gi, si = items.gpus.index(g), stores.index(s)
        for i in range(n_items):
            a[k * len(nodes) + nodes[s], x0 + i * len(stores) + si] -= items.traffic[i, gi]
            a[k * len(nodes) + nodes[g], x0 + i * len(stores) + si] += items.traffic[i, gi]
    r = len(pairs) * len(nodes)
    for j, (_, e) in enumerate(fvars):
        a[r + e, f0 + j] = 1.0
    for e, link in enumerate(topo.links):
        a[r + e, nv - 1] = -link.gbps
        lo[r + e] = -np.inf
    r += len(topo.links)
    for i in range(n_items):
        a[r + i, i * len(stores) : (i + 1) * len(stores)] = 1.0
        lo[r + i] = hi[r + i] = 1.0
    r += n_items
    for si, s in enumerate(stores):
        for i in range(n_items):
            a[r + si, i * len(stores) + si] = items.size_gb[i]
        lo[r + si], hi[r + si] = -np.inf, caps[s]
    cost = np.zeros(nv)
    cost[-1] = 1.0
    integrality = np.zeros(nv)
    integrality[:f0] = 1
    ub = np.full(nv, np.inf)
    ub[:f0] = 1.0
    res = milp(cost, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=integrality, bounds=Bounds(0, ub))
    if res.status != 0:
        raise CapacityError(f"no placement: {res.message}")
    x = res.x[:f0].reshape(n_items, len(stores))
    return Placement([[stores[int(np.argmax(x[i]))]] for i in range(n_items)]), float(res.x[-1])
