"""Minimum-time transfer plans: one LP over the topology, networkx max-flow as a cross-check.

A batch's demand says how many GB each GPU needs from each source (a peer
GPU's cache, a socket's DRAM, an SSD). :func:`schedule_lp` solves the
multi-commodity flow LP (HiGHS through ``scipy.optimize.linprog``)::

    minimise t  s.t.  for each (source, gpu) pair k and node v: flow out - flow in = D_k, -D_k or 0
                      for each link e:  sum_k f_k,e <= gbps_e * t

Endpoints do not forward: a link leaving a GPU, SSD or DRAM carries only that
node's own data, a link entering one only data for it; with ``relay_gpus=True`` a GPU
may forward another GPU's data (peer-to-peer traffic relayed over NVLink hops, which
the multi-process runtime executes as staged send/receive rounds). :func:`maxflow_time`
solves the single-commodity relaxation (any source may serve any GPU, Moment's
formulation) by binary search over ``t`` with ``networkx.maximum_flow``; it is
a lower bound of the LP and equal to it when only one GPU has demand.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from carina.core.errors import CapacityError, ConfigError
from carina.gnn.placement.topology import Link, NodeKind, Topology

__all__ = ["Demand", "Schedule", "maxflow_time", "schedule_lp"]

_ENDPOINTS = {NodeKind.GPU, NodeKind.SSD, NodeKind.DRAM, NodeKind.NIC}
_EPS = 1e-9


@dataclass(frozen=True)
class Demand:
    """``gb`` gigabytes that ``gpu`` needs from ``src``."""

    src: str
    gpu: str
    gb: float


@dataclass
class Schedule:
    """A transfer plan.

    Attributes:
        time_s: Predicted time to deliver every demand.
        flows: Per (src, gpu) pair, GB on each link ``(a, b)``.
        link_gb: GB on each link, all pairs together.
        capacity: GB/s of each link (for utilisation).
    """

    time_s: float
    flows: dict[tuple[str, str], dict[tuple[str, str], float]] = field(default_factory=dict)
    link_gb: dict[tuple[str, str], float] = field(default_factory=dict)
    capacity: dict[tuple[str, str], float] = field(default_factory=dict)

    def utilization(self) -> dict[tuple[str, str], float]:
        """Share of each used link's capacity over ``time_s``."""
        if self.time_s <= 0:
            return {}
        return {e: gb / (self.capacity[e] * self.time_s) for e, gb in self.link_gb.items() if gb > _EPS}

    def routes(self) -> dict[tuple[str, str], list[tuple[list[str], float]]]:
        """Each pair's flow decomposed into paths ``(nodes, GB)``."""
        return {k: _decompose(k[0], k[1], dict(f)) for k, f in self.flows.items()}


def _allowed(link: Link, src: str, gpu: str, kinds: dict[str, NodeKind], relay: bool = False) -> bool:
    def forwards(node: str) -> bool:
        return relay and kinds[src] is NodeKind.GPU and kinds[node] is NodeKind.GPU

    if kinds[link.src] in _ENDPOINTS and link.src != src and not forwards(link.src):
        return False
    if kinds[link.dst] in _ENDPOINTS and link.dst != gpu and not forwards(link.dst):
        return False
    return link.dst != src and link.src != gpu


def _merge(demands: list[Demand], topo: Topology) -> dict[tuple[str, str], float]:
    pairs: dict[tuple[str, str], float] = defaultdict(float)
    for d in demands:
        for end in (d.src, d.gpu):
            if end not in topo.nodes:
                raise ConfigError(f"demand names unknown node {end!r}", key="demand")
        if topo.nodes[d.gpu].kind is not NodeKind.GPU:
            raise ConfigError(f"{d.gpu!r} is not a GPU", key="demand")
        if d.gb < 0:
            raise ConfigError("demand must be >= 0 GB", key="demand")
        if d.src != d.gpu and d.gb > 0:
            pairs[(d.src, d.gpu)] += d.gb
    return dict(pairs)


def schedule_lp(topo: Topology, demands: list[Demand], *, relay_gpus: bool = False) -> Schedule:
    """Minimum-time multi-commodity transfer plan.

    ``relay_gpus`` lets GPUs forward peer GPUs' data (not SSD or DRAM data).

    Raises:
        CapacityError: Some source cannot reach its GPU.
        ConfigError: A demand names an unknown node or a non-GPU destination.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    pairs = _merge(demands, topo)
    capacity = {(x.src, x.dst): x.gbps for x in topo.links}
    if not pairs:
        return Schedule(time_s=0.0, capacity=capacity)
    kinds = {n.name: n.kind for n in topo.nodes.values()}
    nodes = {name: i for i, name in enumerate(topo.nodes)}
    var: list[tuple[int, int]] = []  # (pair index, link index)
    keys = list(pairs)
    for k, (src, gpu) in enumerate(keys):
        var += [(k, e) for e, link in enumerate(topo.links) if _allowed(link, src, gpu, kinds, relay_gpus)]
    nv = len(var) + 1  # last variable is t
    eq_r, eq_c, eq_v = [], [], []
    for j, (k, e) in enumerate(var):
        link = topo.links[e]
        base = k * len(nodes)
        eq_r += [base + nodes[link.src], base + nodes[link.dst]]
        eq_c += [j, j]
        eq_v += [1.0, -1.0]
    # Solved in units of the largest demand: HiGHS's feasibility tolerance (~1e-7) is absolute, so
    # demands of 1e-7 GB came back violating link capacities (a property test found it).
    scale = max(pairs.values()) or 1.0
    b_eq = np.zeros(len(keys) * len(nodes))
    for k, (src, gpu) in enumerate(keys):
        b_eq[k * len(nodes) + nodes[src]] = pairs[(src, gpu)] / scale
        b_eq[k * len(nodes) + nodes[gpu]] = -pairs[(src, gpu)] / scale
    ub_r = [e for _, e in var] + list(range(len(topo.links)))
    ub_c = list(range(len(var))) + [nv - 1] * len(topo.links)
    ub_v = [1.0] * len(var) + [-x.gbps for x in topo.links]
    a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(len(b_eq), nv)).tocsr()
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(topo.links), nv)).tocsr()
    cost = np.zeros(nv)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(len(topo.links)), A_eq=a_eq, b_eq=b_eq, method="highs")
    if res.status != 0:
        raise CapacityError(f"no transfer plan: {res.message}", pairs=len(keys))
    flows: dict[tuple[str, str], dict[tuple[str, str], float]] = {k: {} for k in keys}
    link_gb: dict[tuple[str, str], float] = defaultdict(float)
    for j, (k, e) in enumerate(var):
        if res.x[j] > _EPS:
            link = topo.links[e]
            flows[keys[k]][(link.src, link.dst)] = float(res.x[j]) * scale
            link_gb[(link.src, link.dst)] += float(res.x[j]) * scale
    return Schedule(time_s=float(res.x[-1]) * scale, flows=flows, link_gb=dict(link_gb), capacity=capacity)


def maxflow_time(topo: Topology, demands: list[Demand], *, tol: float = 1e-6) -> float:
    """Moment's relaxation: smallest ``t`` at which one max-flow from all sources meets all demand."""
    import networkx as nx

    pairs = _merge(demands, topo)
    if not pairs:
        return 0.0
    supply: dict[str, float] = defaultdict(float)
    need: dict[str, float] = defaultdict(float)
    scale = sum(pairs.values())  # solved for one unit of demand, then scaled back: a tiny demand keeps its precision
    for (src, gpu), gb in pairs.items():
        supply[src] += gb / scale
        need[gpu] += gb / scale
    total = sum(need.values())

    def feasible(t: float) -> bool:
        g = nx.DiGraph()
        for link in topo.links:
            g.add_edge(link.src, link.dst, capacity=link.gbps * t)
        for s, gb in supply.items():
            g.add_edge("__source__", s, capacity=gb)
        for d, gb in need.items():
            g.add_edge(d, "__sink__", capacity=gb)
        value = nx.maximum_flow_value(g, "__source__", "__sink__")
        return bool(value >= total * (1 - 1e-9))

    hi = total / min(x.gbps for x in topo.links) * len(topo.nodes)
    if not feasible(hi):
        raise CapacityError("demand cannot be met at any time: a source cannot reach its GPU")
    lo = 0.0
    while hi - lo > tol * max(hi, 1e-12):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return hi * scale


def _decompose(src: str, dst: str, flow: dict[tuple[str, str], float]) -> list[tuple[list[str], float]]:
    out_edges: dict[str, list[str]] = defaultdict(list)
    for a, b in flow:
        out_edges[a].append(b)
    paths: list[tuple[list[str], float]] = []
    while True:
        path, seen, node = [src], {src}, src
        while node != dst:
            nxt = next((b for b in out_edges[node] if flow.get((node, b), 0) > _EPS and b not in seen), None)
            if nxt is None:
                break
            path.append(nxt)
            seen.add(nxt)
            node = nxt
        if node != dst:
            return paths
        amount = min(flow[(a, b)] for a, b in itertools.pairwise(path))
        for a, b in itertools.pairwise(path):
            flow[(a, b)] -= amount
        paths.append((path, amount))
