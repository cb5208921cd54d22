"""Simple-path enumeration from an attacker to a target, aggregated on the fly.

STRonG lists every simple path (graph-tool ``all_paths``) and scores each in Python.
Here one iterative depth-first search over the CSR graph, compiled with numba when it
is installed, folds every path into running sums as it is found: counts by length,
``sum log(1 - p)``, ``sum p * impact``, per-node path counts. Nothing is materialised
unless asked (``record``), so memory stays flat whatever the path count.

Pruning is optional and certified: a prefix ending in ``v`` with probability ``q``,
impact ``I`` and ``r`` edges of budget left is skipped when
``q * sum_k W_k(v) * (I + k * w_max) < prune_below``, where ``W_k(v)`` sums the
probability products of all *walks* of ``k`` edges from ``v`` to the target. Walks
include every simple path, so the skipped prefixes' summed bounds are an upper bound on
the risk and the path-probability mass that was not enumerated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from carina.security.risk.graph import RiskGraph

__all__ = ["PathSums", "enumerate_paths", "have_numba", "walk_bounds"]

# Layout of the float and int accumulators shared with the kernel.
F_LOG1M, F_SUM_P, F_RISK, F_IMP_SUM, F_IMP_MIN, F_IMP_MAX, F_PR_MIN, F_PR_MAX = range(8)
F_VR_SUM, F_VR_MIN, F_VR_MAX, F_BOUND_P, F_BOUND_RISK, F_BOUND_PATHS = range(8, 14)
I_PATHS, I_CERTAIN, I_PRUNED, I_DROPPED, I_RECORDED, I_REC_FULL = range(6)


def _kernel(  # noqa: PLR0915 - one flat loop is what the compiler wants
    indptr: Any, indices: Any, prob: Any, wimp: Any, alive: Any,
    source: int, target: int, max_edges: int, prune_below: float, drop_below: float,
    wp: Any, wk: Any, wc: Any, w_max: float,
    hist: Any, node_paths: Any, node_risk: Any, f: Any, c: Any, rec_nodes: Any, rec_ptr: Any,
) -> None:  # fmt: skip
    n = prob.shape[0]
    stack = np.empty(max_edges + 1, np.int64)
    nxt = np.empty(max_edges + 1, np.int64)
    pp = np.empty(max_edges + 1, np.float64)
    ii = np.empty(max_edges + 1, np.float64)
    vv = np.empty(max_edges + 1, np.float64)
    on = np.zeros(n, np.bool_)
    stack[0], nxt[0], pp[0], ii[0], vv[0] = source, indptr[source], 1.0, 0.0, 0.0
    on[source] = True
    depth = 0
    while depth >= 0:
        v = stack[depth]
        if nxt[depth] >= indptr[v + 1]:
            on[v] = False
            depth -= 1
            continue
        w = indices[nxt[depth]]
        nxt[depth] += 1
        if on[w] or not alive[w] or depth + 1 > max_edges:
            continue
        p = pp[depth] * prob[w]
        im = ii[depth] + wimp[w]
        vr = vv[depth] + p * im
        if w == target:
            if p < drop_below:
                c[I_DROPPED] += 1
                continue
            c[I_PATHS] += 1
            hist[depth + 2] += 1
            if p >= 1.0:
                c[I_CERTAIN] += 1
            else:
                f[F_LOG1M] += np.log1p(-p)
            f[F_SUM_P] += p
            f[F_RISK] += p * im
            f[F_IMP_SUM] += im
            f[F_IMP_MIN] = min(f[F_IMP_MIN], im)
            f[F_IMP_MAX] = max(f[F_IMP_MAX], im)
            f[F_PR_MIN] = min(f[F_PR_MIN], p * im)
            f[F_PR_MAX] = max(f[F_PR_MAX], p * im)
            f[F_VR_SUM] += vr
            f[F_VR_MIN] = min(f[F_VR_MIN], vr)
            f[F_VR_MAX] = max(f[F_VR_MAX], vr)
            for k in range(1, depth + 1):
                node_paths[stack[k]] += 1
                node_risk[stack[k]] += p * im
            if c[I_REC_FULL] == 0:
                r = c[I_RECORDED]
                start = rec_ptr[r]
                if r + 1 < rec_ptr.shape[0] and start + depth + 2 <= rec_nodes.shape[0]:
                    for k in range(depth + 1):
                        rec_nodes[start + k] = stack[k]
                    rec_nodes[start + depth + 1] = w
                    rec_ptr[r + 1] = start + depth + 2
                    c[I_RECORDED] += 1
                else:
                    c[I_REC_FULL] = 1
            continue
        left = max_edges - depth - 1
        if left <= 0:
            continue
        if prune_below > 0.0:
            bound_risk = p * (im * wp[w, left] + w_max * wk[w, left])
            if bound_risk < prune_below:
                c[I_PRUNED] += 1
                f[F_BOUND_P] += p * wp[w, left]
                f[F_BOUND_RISK] += bound_risk
                f[F_BOUND_PATHS] += wc[w, left]
                continue
        depth += 1
        stack[depth], nxt[depth], pp[depth], ii[depth], vv[depth] = w, indptr[w], p, im, vr
        on[w] = True


def _compile() -> tuple[Any, bool]:
    try:
        import numba
    except ImportError:
        return _kernel, False
    return numba.njit(cache=True, nogil=True)(_kernel), True


_COMPILED: tuple[Any, bool] | None = None


def have_numba() -> bool:
    """Whether the compiled kernel is available (else a pure-Python loop runs)."""
    return _get()[1]


def _get() -> tuple[Any, bool]:
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = _compile()
    return _COMPILED


def walk_bounds(
    graph: RiskGraph, source: int, target: int, max_edges: int, alive: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative walk sums to ``target``: ``wp[v, r] = sum_{k<=r} W_k(v)``, ``wk`` weights by k, ``wc`` counts.

    Walks avoid ``source`` and meet ``target`` only at their end, like the simple paths
    they bound.
    """
    n = graph.n
    src = np.repeat(np.arange(n), np.diff(graph.indptr))
    dst = graph.indices
    ok = alive[src] & alive[dst] & (src != target)
    src, dst = src[ok], dst[ok]
    inner = alive.copy()
    inner[[source, target]] = False
    weight = np.where(dst == target, graph.probability[dst], graph.probability[dst] * inner[dst])
    count_w = np.where(dst == target, 1.0, inner[dst].astype(np.float64))
    wp = np.zeros((n, max_edges + 1))
    wk = np.zeros((n, max_edges + 1))
    wc = np.zeros((n, max_edges + 1))
    s_k: np.ndarray = np.zeros(n)
    s_k[target] = 1.0  # W_0: the empty walk at the target
    c_k: np.ndarray = s_k.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(1, max_edges + 1):
            s_k = np.bincount(src, weights=weight * s_k[dst], minlength=n)
            c_k = np.bincount(src, weights=count_w * c_k[dst], minlength=n)
            s_k[target] = c_k[target] = 0.0  # walks pass the target only at the end
            wp[:, k] = wp[:, k - 1] + s_k
            wk[:, k] = wk[:, k - 1] + k * s_k
            wc[:, k] = wc[:, k - 1] + c_k
    return wp, wk, wc


@dataclass
class PathSums:
    """Aggregates over the simple paths from one source to one target."""

    hist: np.ndarray  # paths by number of nodes
    node_paths: np.ndarray  # paths through each node (endpoints excluded)
    node_risk: np.ndarray  # risk (sum p * impact) of the paths through each node
    floats: np.ndarray
    ints: np.ndarray
    recorded: list[np.ndarray]

    def merge(self, other: PathSums) -> None:
        """Add another source's sums (several attackers, one target)."""
        f, g = self.floats, other.floats
        for i in (F_LOG1M, F_SUM_P, F_RISK, F_IMP_SUM, F_VR_SUM, F_BOUND_P, F_BOUND_RISK, F_BOUND_PATHS):
            f[i] += g[i]
        for lo, hi in ((F_IMP_MIN, F_IMP_MAX), (F_PR_MIN, F_PR_MAX), (F_VR_MIN, F_VR_MAX)):
            f[lo], f[hi] = min(f[lo], g[lo]), max(f[hi], g[hi])
        self.ints[:I_REC_FULL] += other.ints[:I_REC_FULL]
        self.ints[I_REC_FULL] |= other.ints[I_REC_FULL]
        self.hist += other.hist
        self.node_paths += other.node_paths
        self.node_risk += other.node_risk
        self.recorded.extend(other.recorded)


def enumerate_paths(
    graph: RiskGraph,
    source: int,
    target: int,
    *,
    max_edges: int,
    prune_below: float = 0.0,
    drop_below: float = 0.0,
    record: int = 0,
) -> PathSums:
    """Fold every simple path ``source -> target`` of at most ``max_edges`` edges.

    Args:
        graph: The model graph.
        source: Attacker node index.
        target: Target node index.
        max_edges: Longest path considered, in edges (STRonG's ``all_paths`` cutoff).
        prune_below: Skip prefixes whose certified risk bound is below this (0: exact).
        drop_below: Paths with probability below this are dropped, as STRonG's ``-C``.
        record: Keep up to this many paths (node index arrays) for reports and noise trials.
    """
    kernel, _ = _get()
    n = graph.n
    hist = np.zeros(max_edges + 2, np.int64)
    node_paths = np.zeros(n, np.int64)
    node_risk = np.zeros(n)
    f = np.zeros(14)
    f[[F_IMP_MIN, F_PR_MIN, F_VR_MIN]] = np.inf
    f[[F_IMP_MAX, F_PR_MAX, F_VR_MAX]] = -np.inf
    c = np.zeros(6, np.int64)
    if source == target:
        return PathSums(hist, node_paths, node_risk, f, c, [])
    alive = graph.relevant_nodes(source, target)
    wimp = graph.impact * np.sqrt(graph.out_degree)
    if prune_below > 0.0:
        wp, wk, wc = walk_bounds(graph, source, target, max_edges, alive)
    else:
        wp = wk = wc = np.zeros((1, 1), dtype=np.float64)
    rec_ptr = np.zeros(record + 1, np.int64)
    rec_nodes = np.zeros(max(record, 0) * 32 + 1, np.int64)
    w_max = float(wimp[alive].max()) if alive.any() else 0.0
    kernel(
        graph.indptr, graph.indices, graph.probability, wimp, alive,
        source, target, max_edges, prune_below, drop_below, wp, wk, wc, w_max,
        hist, node_paths, node_risk, f, c, rec_nodes, rec_ptr,
    )  # fmt: skip
    recorded = [rec_nodes[rec_ptr[i] : rec_ptr[i + 1]].copy() for i in range(int(c[I_RECORDED]))]
    return PathSums(hist, node_paths, node_risk, f, c, recorded)
