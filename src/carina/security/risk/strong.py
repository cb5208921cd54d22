"""The STRonG-compatible scorer: its numbers, every digit, much faster.

Per target, over every simple attacker-to-target path ``v0 (attacker), v1, ..., vL``:
``p_path = prod p(v1..vL)`` (the attacker's own score is left out),
``impact_path = sum impact(vi) * sqrt(outdeg(vi))``, ``Risk = sum p_path * impact_path``,
``P_total = 1 - prod(1 - p_path)``, ``Exploitability = 3.86 * P_total``. The reported
normalising ``shift`` is STRonG's: the step search (at most 20 steps, |error| <= 1e-4)
for ``s`` such that paths of all-``0.5+s`` nodes give ``P_total = 0.5``; as in STRonG
it is reported, not applied. Modes are the three largest per-node path counts.

Known weaknesses, kept for compatibility (the other scorers do not have them):
``P_total`` treats paths as independent although they share nodes, ``Risk`` grows with
the number of paths, and the square-root degree weight is ad hoc.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from carina.core.config import Config, require
from carina.security.risk import paths as P
from carina.security.risk.graph import RiskGraph
from carina.security.risk.scoring import TargetScore, require_endpoints

__all__ = ["StrongConfig", "StrongScorer", "find_shift"]

EXPLOITABILITY = 3.86


@dataclass(kw_only=True)
class StrongConfig(Config):
    """Options of the STRonG-compatible scorer.

    Attributes:
        max_edges: Longest path in edges; 0 means STRonG's ``max(50, int(0.85 * nodes))``.
        drop_below: Drop paths less likely than this (STRonG's ``-C``), uncounted.
        prune_below: Skip prefixes whose certified risk bound is below this; the skipped
            mass is reported as bounds (0 = exact enumeration).
        record: Keep up to this many paths for reports and noise trials.
        rel_tolerance: When > 0 and ``prune_below`` is 0: start pruning at 1e-6 and divide
            the threshold by 10 until the certified bounds are this tight (relative).
        time_budget_s: Stop tightening once a pass would start after this many seconds.
    """

    max_edges: int = 0
    drop_below: float = 0.0
    prune_below: float = 0.0
    record: int = 0
    rel_tolerance: float = 0.0
    time_budget_s: float = 60.0

    def validate(self) -> None:
        """Check the fields."""
        require(self.max_edges >= 0, "must be >= 0", key="max_edges")
        require(0.0 <= self.drop_below <= 1.0, "must be in [0, 1]", key="drop_below")
        require(self.prune_below >= 0.0, "must be >= 0", key="prune_below")
        require(self.record >= 0, "must be >= 0", key="record")
        require(self.rel_tolerance >= 0.0, "must be >= 0", key="rel_tolerance")
        require(self.time_budget_s > 0.0, "must be positive", key="time_budget_s")


class StrongScorer:
    """Scorer ``strong``: STRonG's path statistics, enumerated by a compiled DFS."""

    name = "strong"
    Config = StrongConfig

    def __init__(self, config: StrongConfig | None = None) -> None:
        self.config = config or StrongConfig()

    def max_edges(self, graph: RiskGraph) -> int:
        """The path-length cutoff used on ``graph``."""
        return self.config.max_edges or max(50, int(graph.n * 0.85))

    def sums(self, graph: RiskGraph, target: int, prune_below: float | None = None) -> P.PathSums:
        """Path aggregates from every attacker to ``target``."""
        total: P.PathSums | None = None
        for a in graph.attackers:
            s = P.enumerate_paths(
                graph,
                int(a),
                target,
                max_edges=self.max_edges(graph),
                prune_below=self.config.prune_below if prune_below is None else prune_below,
                drop_below=self.config.drop_below,
                record=self.config.record,
            )
            if total is None:
                total = s
            else:
                total.merge(s)
        assert total is not None, "a graph without attackers has no scores"
        return total

    def score(self, graph: RiskGraph) -> list[TargetScore]:
        """STRonG's statistics for each target."""
        require_endpoints(graph)
        out = []
        for t in graph.targets:
            if self.config.rel_tolerance > 0.0 and self.config.prune_below == 0.0:
                out.append(self._tighten(graph, int(t)))
            else:
                out.append(summarise(graph, int(t), self.sums(graph, int(t))))
        return out

    def _tighten(self, graph: RiskGraph, target: int) -> TargetScore:
        import time

        start, eps = time.perf_counter(), 1e-6
        while True:
            result = summarise(graph, target, self.sums(graph, target, prune_below=eps))
            result.details["prune_below"] = eps
            lo, hi = result.bounds or (result.value, result.value)
            if hi - lo <= self.config.rel_tolerance * lo or time.perf_counter() - start > self.config.time_budget_s:
                return result
            eps /= 10.0


def find_shift(hist: np.ndarray) -> float:
    """STRonG's normalising shift from the path-length histogram (lengths in nodes)."""
    lengths = np.nonzero(hist)[0]
    counts = hist[lengths].astype(np.float64)

    def p_total(p: float) -> float:
        return float(1.0 - np.prod((1.0 - p ** lengths.astype(np.float64)) ** counts))

    shift, eps, step, steps = 0.0, 0.5, -0.25, 0
    old = p_total(0.5) - 0.5
    while abs(eps) > 1e-4 and steps < 20:
        shift += step
        eps = p_total(0.5 + shift) - 0.5
        if abs(eps) > abs(old) and eps * old >= 0.0:
            step = -step
        elif abs(eps) < abs(old) and eps * old >= 0.0:
            step = step / 2.0
        else:
            step = -step / 2.0
        old = eps
        steps += 1
    return shift


def summarise(graph: RiskGraph, target: int, s: P.PathSums) -> TargetScore:
    """Turn path sums into STRonG's printed statistics."""
    f, c = s.floats, s.ints
    n_paths = int(c[P.I_PATHS])
    p_total = 1.0 if c[P.I_CERTAIN] else -math.expm1(f[P.F_LOG1M])
    risk = float(f[P.F_RISK])
    pruned = int(c[P.I_PRUNED])
    details: dict[str, Any] = {"paths": n_paths, "dropped_paths": int(c[P.I_DROPPED]), "pruned_prefixes": pruned}
    details.update(_length_stats(s.hist))
    details["shift"] = find_shift(s.hist) if n_paths else 0.0
    details["p_total"] = p_total
    details["exploitability"] = EXPLOITABILITY * p_total
    details["avg_pp"] = f[P.F_SUM_P] / n_paths if n_paths else 0.0
    for key, (lo, hi, tot) in {
        "impact": (P.F_IMP_MIN, P.F_IMP_MAX, P.F_IMP_SUM),
        "vrisk": (P.F_VR_MIN, P.F_VR_MAX, P.F_VR_SUM),
        "prisk": (P.F_PR_MIN, P.F_PR_MAX, P.F_RISK),
    }.items():
        details[key] = {"min": f[lo], "max": f[hi], "avg": f[tot] / n_paths} if n_paths else None
    details["risk"] = risk
    details["modes"] = modes(graph, s.node_paths)
    details["node_paths"] = {graph.names[i]: int(k) for i, k in enumerate(s.node_paths) if k}
    details["node_risk"] = {graph.names[i]: float(r) for i, r in enumerate(s.node_risk) if r}
    bounds = None
    if pruned:
        bp = min(1.0, float(f[P.F_BOUND_P]))
        bounds = (risk, risk + float(f[P.F_BOUND_RISK]))
        details["p_total_bounds"] = [p_total, p_total + (1.0 - p_total) * bp]
        details["paths_bounds"] = [n_paths, n_paths + float(f[P.F_BOUND_PATHS])]
    return TargetScore(
        scorer="strong",
        target=graph.names[target],
        metric="risk",
        value=risk,
        exact=not pruned,
        bounds=bounds,
        details=details,
    )


def _length_stats(hist: np.ndarray) -> dict[str, Any]:
    lengths = np.nonzero(hist)[0]
    if len(lengths) == 0:
        return {"shortest": None, "longest": None, "histogram": []}
    counts = hist[lengths]
    n = int(counts.sum())
    mean = float((lengths * counts).sum() / n)
    var = float((counts * (lengths - mean) ** 2).sum() / (n - 1)) if n > 1 else 0.0
    cum = np.cumsum(counts)
    lo = int(lengths[np.searchsorted(cum, (n - 1) // 2 + 1)])
    hi = int(lengths[np.searchsorted(cum, n // 2 + 1)])
    return {
        "shortest": int(lengths[0]),
        "shortest_count": int(counts[0]),
        "longest": int(lengths[-1]),
        "longest_count": int(counts[-1]),
        "mean_length": mean,
        "stdev_length": math.sqrt(var),
        "median_length": (lo + hi) / 2.0,
        "mode_lengths": [int(x) for x in lengths[counts == counts.max()]],
        "histogram": [[int(b), int(k)] for b, k in zip(lengths, counts, strict=True)],
    }


def modes(graph: RiskGraph, node_paths: np.ndarray) -> list[dict[str, Any]]:
    """The three largest per-node path counts and the nodes that have them (choke points)."""
    out = []
    for level in sorted({int(k) for k in node_paths if k > 0}, reverse=True)[:3]:
        out.append({"paths": level, "nodes": [graph.names[i] for i in np.nonzero(node_paths == level)[0]]})
    return out
