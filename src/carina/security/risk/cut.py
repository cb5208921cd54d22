"""Weakest-adversary cuts and the k most likely attack paths.

``mincut``: every attacker-to-target path must cross any node cut ``C`` (attackers and
target excluded) and end in the target, so the reachability probability is at most
``p_target * (1 - prod_{v in C} (1 - p_v))``. The cut that
minimises ``sum -log(1 - p_v)`` (a max-flow on the node-split graph) gives the tightest
such bound and names the cheapest set of nodes to harden: securing all of them
disconnects the target. ``kpaths``: Yen's k shortest simple paths with edge weight
``-log p(head)``, i.e. the k most likely attack paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice
from typing import Any

from carina.core.config import Config, require
from carina.security.risk.graph import RiskGraph
from carina.security.risk.scoring import TargetScore, require_endpoints

__all__ = ["KPathsConfig", "KPathsScorer", "MinCutConfig", "MinCutScorer", "most_likely_paths", "weakest_cut"]

_SOURCE = ("attackers",)


def _digraph(graph: RiskGraph) -> Any:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(graph.n))
    g.add_edges_from(graph.edges())
    return g


def weakest_cut(graph: RiskGraph, target: int) -> tuple[list[int], float]:
    """The node cut minimising ``sum -log(1 - p)`` and the reachability bound it gives.

    An empty cut with bound ``p_target`` means an attacker touches the target directly.
    """
    import networkx as nx

    attackers = {int(a) for a in graph.attackers}
    if target in attackers:
        return [], 1.0
    flow = nx.DiGraph()
    for v in range(graph.n):
        p = float(graph.probability[v])
        cap = math.inf if v in attackers or v == target or p >= 1.0 else -math.log1p(-p)
        flow.add_edge(("in", v), ("out", v), capacity=cap)
    for v, w in graph.edges():
        flow.add_edge(("out", v), ("in", w))  # no capacity attribute = infinite
    for a in attackers:
        flow.add_edge(_SOURCE, ("in", a))
    sink = ("out", target)
    if not nx.has_path(flow, _SOURCE, sink):
        return [], 0.0
    p_target = float(graph.probability[target])
    try:
        value, (side, _) = nx.minimum_cut(flow, _SOURCE, sink)
    except nx.NetworkXUnbounded:  # a chain of certain nodes joins an attacker to the target
        return [], p_target
    if math.isinf(value):
        return [], p_target
    cut = sorted(v for v in range(graph.n) if ("in", v) in side and ("out", v) not in side)
    return cut, p_target * -math.expm1(-value)


@dataclass(kw_only=True)
class MinCutConfig(Config):
    """The min-cut scorer has no options yet."""


class MinCutScorer:
    """Scorer ``mincut``: the weakest-adversary cut and its reachability upper bound."""

    name = "mincut"
    Config = MinCutConfig

    def __init__(self, config: MinCutConfig | None = None) -> None:
        self.config = config or MinCutConfig()

    def score(self, graph: RiskGraph) -> list[TargetScore]:
        """Cut and bound for every target."""
        require_endpoints(graph)
        out = []
        for t in (int(x) for x in graph.targets):
            cut, bound = weakest_cut(graph, t)
            details = {
                "cut": [graph.names[v] for v in cut],
                "cut_probabilities": [float(graph.probability[v]) for v in cut],
            }
            out.append(
                TargetScore(
                    scorer=self.name, target=graph.names[t], metric="p_reach_bound", value=bound, details=details
                )
            )
        return out


def most_likely_paths(graph: RiskGraph, target: int, k: int) -> list[tuple[list[int], float]]:
    """Up to ``k`` simple attacker-to-target paths, most likely first, with their probabilities."""
    import networkx as nx

    g = _digraph(graph)
    for v, w in list(g.edges()):
        p = float(graph.probability[w])
        if p <= 0.0:
            g.remove_edge(v, w)
        else:
            g[v][w]["weight"] = -math.log(p)
    source = -1
    for a in graph.attackers:
        g.add_edge(source, int(a), weight=0.0)
    if not nx.has_path(g, source, target):
        return []
    out = []
    for path in islice(nx.shortest_simple_paths(g, source, target, weight="weight"), k):
        nodes = path[1:]
        out.append((nodes, math.prod(float(graph.probability[v]) for v in nodes[1:])))
    return out


@dataclass(kw_only=True)
class KPathsConfig(Config):
    """Options of the k-most-likely-paths scorer."""

    k: int = 10

    def validate(self) -> None:
        """Check the fields."""
        require(self.k > 0, "must be positive", key="k")


class KPathsScorer:
    """Scorer ``kpaths``: the k most likely attack paths; the headline is the best one's probability."""

    name = "kpaths"
    Config = KPathsConfig

    def __init__(self, config: KPathsConfig | None = None) -> None:
        self.config = config or KPathsConfig()

    def score(self, graph: RiskGraph) -> list[TargetScore]:
        """Top paths for every target."""
        require_endpoints(graph)
        out = []
        for t in (int(x) for x in graph.targets):
            paths = most_likely_paths(graph, t, self.config.k)
            rows = [{"nodes": [graph.names[v] for v in p], "probability": prob} for p, prob in paths]
            best = paths[0][1] if paths else 0.0
            out.append(
                TargetScore(
                    scorer=self.name, target=graph.names[t], metric="p_best_path", value=best, details={"paths": rows}
                )
            )
        return out
