"""Reachability probability: the chance an attacker gets to a target at all.

Every node other than the attackers is compromised independently with its probability;
the target is reached when a chain of compromised nodes joins an attacker to it
(the target included). Unlike STRonG's ``P_total`` this does not assume that paths
sharing nodes are independent, it never counts a node twice, and a node of
probability 0 changes nothing.

``exact`` factors on one frontier node at a time (up or down) with memoisation on
(reached set, ruled-out set) and gives up beyond ``max_states``; ``montecarlo`` samples
node states, 64 samples per machine word, and reports a Wilson confidence interval;
``auto`` tries exact first.
"""

from __future__ import annotations

import enum
import math
import sys
from dataclasses import dataclass

import numpy as np

from carina.core.config import Config, require
from carina.core.errors import CapacityError
from carina.security.risk.graph import RiskGraph
from carina.security.risk.scoring import TargetScore, require_endpoints

__all__ = ["ReachConfig", "ReachMethod", "ReachScorer", "reach_exact", "reach_montecarlo"]


class ReachMethod(enum.Enum):
    """How the probability is computed."""

    AUTO = "auto"
    EXACT = "exact"
    MONTECARLO = "montecarlo"


@dataclass(kw_only=True)
class ReachConfig(Config):
    """Options of the reachability scorer.

    Attributes:
        method: ``auto`` (exact when it fits in ``max_states``), ``exact`` or ``montecarlo``.
        max_states: Memo entries the exact method may create before giving up.
        samples: Monte Carlo samples (rounded up to a multiple of 64).
        seed: Monte Carlo seed; the same seed couples runs on different scores.
        confidence: Two-sided confidence level of the Monte Carlo interval.
    """

    method: ReachMethod = ReachMethod.AUTO
    max_states: int = 200_000
    samples: int = 200_000
    seed: int = 0
    confidence: float = 0.95

    def validate(self) -> None:
        """Check the fields."""
        require(self.max_states > 0, "must be positive", key="max_states")
        require(self.samples > 0, "must be positive", key="samples")
        require(0.0 < self.confidence < 1.0, "must be in (0, 1)", key="confidence")


class ReachScorer:
    """Scorer ``reach``: probability that the target is reachable through compromised nodes."""

    name = "reach"
    Config = ReachConfig

    def __init__(self, config: ReachConfig | None = None) -> None:
        self.config = config or ReachConfig()

    def score(self, graph: RiskGraph) -> list[TargetScore]:
        """Reachability of every target."""
        require_endpoints(graph)
        out = []
        cfg = self.config
        for t in (int(x) for x in graph.targets):
            method = cfg.method
            if method is not ReachMethod.MONTECARLO:
                try:
                    p, states = reach_exact(graph, t, max_states=cfg.max_states)
                    out.append(_result(graph, t, p, True, None, {"method": "exact", "states": states}))
                    continue
                except CapacityError:
                    if method is ReachMethod.EXACT:
                        raise
            p, lo, hi = reach_montecarlo(graph, t, samples=cfg.samples, seed=cfg.seed, confidence=cfg.confidence)
            details = {"method": "montecarlo", "samples": _round64(cfg.samples), "confidence": cfg.confidence}
            out.append(_result(graph, t, p, False, (lo, hi), details))
        return out


def _result(
    graph: RiskGraph, t: int, p: float, exact: bool, bounds: tuple[float, float] | None, details: dict[str, object]
) -> TargetScore:
    return TargetScore(
        scorer="reach", target=graph.names[t], metric="p_reach", value=p, exact=exact, bounds=bounds, details=details
    )


def _round64(n: int) -> int:
    return -(-n // 64) * 64


def reach_exact(graph: RiskGraph, target: int, *, max_states: int = 200_000) -> tuple[float, int]:
    """Exact reachability probability of ``target`` and the peak number of states used.

    Undirected graphs use a frontier dynamic programme over a breadth-first node order
    (states: connectivity classes of the nodes still on the frontier), exponential only
    in the frontier width; directed graphs factor on frontier nodes with memoisation.

    Raises:
        CapacityError: More than ``max_states`` states would be needed.
    """
    if target in {int(a) for a in graph.attackers}:
        return 1.0, 0
    if graph.directed:
        return _factoring(graph, target, max_states)
    return _frontier(graph, target, max_states)


_DOWN, _A, _T = 0, -1, -2


def _frontier(graph: RiskGraph, target: int, max_states: int) -> tuple[float, int]:
    attackers = {int(a) for a in graph.attackers}
    order = _bfs_order(graph, attackers)
    if target not in order:
        return 0.0, 0
    pos = {v: i for i, v in enumerate(order)}
    last = {v: max([pos[v], *(pos[int(w)] for w in graph.neighbours(v) if int(w) in pos)]) for v in order}
    boundary: list[int] = []
    states: dict[tuple[int, ...], float] = {(): 1.0}
    success, peak = 0.0, 1
    for i, v in enumerate(order):
        p = 1.0 if v in attackers else float(graph.probability[v])
        nbr = {boundary.index(int(w)) for w in graph.neighbours(v) if int(w) in pos and pos[int(w)] < i}
        own = _A if v in attackers else _T if v == target else len(boundary) + 1
        nxt: dict[tuple[int, ...], float] = {}
        for labels, q in states.items():
            if p < 1.0 and v != target:
                _put(nxt, (*labels, _DOWN), q * (1.0 - p))
            if p <= 0.0:
                continue
            merged = {labels[j] for j in nbr if labels[j] != _DOWN} | {own}
            if _A in merged and _T in merged:
                success += q * p
                continue
            new = _A if _A in merged else _T if _T in merged else min(merged)
            _put(nxt, (*(new if x in merged else x for x in labels), new), q * p)
        boundary.append(v)
        keep = [j for j, u in enumerate(boundary) if last[u] > i]
        boundary = [boundary[j] for j in keep]
        states = {}
        for labels, q in nxt.items():
            kept = tuple(labels[j] for j in keep)
            if _A not in kept or (_T in labels and _T not in kept):
                continue  # no attacker class left, or the target was cut off: never reached
            _put(states, _canonical(kept), q)
        peak = max(peak, len(states))
        if peak > max_states:
            raise CapacityError(f"exact reachability needs more than {max_states} states", key="max_states")
    return success, peak


def _put(d: dict[tuple[int, ...], float], key: tuple[int, ...], q: float) -> None:
    d[key] = d.get(key, 0.0) + q


def _canonical(labels: tuple[int, ...]) -> tuple[int, ...]:
    names: dict[int, int] = {}
    return tuple(x if x <= 0 else names.setdefault(x, len(names) + 1) for x in labels)


def _bfs_order(graph: RiskGraph, attackers: set[int]) -> list[int]:
    order = sorted(attackers)
    seen = set(order)
    head = 0
    while head < len(order):
        for w in graph.neighbours(order[head]):
            if int(w) not in seen and graph.probability[int(w)] > 0.0:
                seen.add(int(w))
                order.append(int(w))
        head += 1
    return order


def _factoring(graph: RiskGraph, target: int, max_states: int) -> tuple[float, int]:
    attackers = [int(a) for a in graph.attackers]
    nbr = [0] * graph.n
    for v in range(graph.n):
        for w in graph.neighbours(v):
            if graph.probability[w] > 0.0:
                nbr[v] |= 1 << int(w)
    prob = [float(p) for p in graph.probability]
    tbit = 1 << target
    memo: dict[tuple[int, int], float] = {}

    def solve(reached: int, out: int) -> float:
        key = (reached, out)
        hit = memo.get(key)
        if hit is not None:
            return hit
        frontier = 0
        r = reached
        while r:
            low = r & -r
            frontier |= nbr[low.bit_length() - 1]
            r ^= low
        frontier &= ~(reached | out)
        if frontier & tbit:
            value = prob[target]
        elif not frontier:
            value = 0.0
        else:
            low = frontier & -frontier
            v = low.bit_length() - 1
            value = prob[v] * solve(reached | low, out) + (1.0 - prob[v]) * solve(reached, out | low)
        if len(memo) >= max_states:
            raise CapacityError(f"exact reachability needs more than {max_states} states", key="max_states")
        memo[key] = value
        return value

    start = 0
    for a in attackers:
        start |= 1 << a
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * graph.n + 1000))
    try:
        return solve(start, 0), len(memo)
    finally:
        sys.setrecursionlimit(limit)


def reach_montecarlo(
    graph: RiskGraph, target: int, *, samples: int = 200_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Sampled reachability: (estimate, low, high) with a Wilson interval."""
    words = _round64(samples) // 64
    rng = np.random.default_rng(seed)
    n = graph.n
    up = np.zeros((n, words), np.uint64)
    bits = np.uint64(1) << np.arange(64, dtype=np.uint64)
    for v in range(n):  # one uniform per (node, sample), drawn in node order: coupled across scores
        u = rng.random((words, 64)) < graph.probability[v]
        up[v] = (u * bits).sum(axis=1, dtype=np.uint64)
    reached = np.zeros((n, words), np.uint64)
    for a in graph.attackers:
        up[int(a)] = reached[int(a)] = ~np.uint64(0)
    src = np.repeat(np.arange(n), np.diff(graph.indptr))
    dst = graph.indices
    for _ in range(n):
        spread = reached[src] & up[dst]
        new = reached.copy()
        np.bitwise_or.at(new, dst, spread)
        if np.array_equal(new, reached):
            break
        reached = new
    hits = int(np.unpackbits(reached[target].view(np.uint8)).sum())
    total = words * 64
    return hits / total, *_wilson(hits, total, confidence)


def _wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = k / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)
