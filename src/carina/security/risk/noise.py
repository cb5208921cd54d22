"""Score noise for robustness checks: how much do conclusions depend on exact scores?

``relative``: ``p' = clip(p * (1 + s z))`` and likewise for impact, ``s`` = percent/100.
``strong``: STRonG's ``-E``: ``p' = clip(p + z * sqrt(percent) / 100)``, impact clipped
to [0, 4]. ``z`` is standard normal, drawn per node *name* and trial, so a node shared by
two designs gets the same error in both (the scoring error is the scorer's, not the
design's).
"""

from __future__ import annotations

import enum
import hashlib

import numpy as np

from carina.security.risk.graph import RiskGraph

__all__ = ["NoiseModel", "perturb"]


class NoiseModel(enum.Enum):
    """Shape of the score noise."""

    RELATIVE = "relative"
    STRONG = "strong"


def _normals(names: tuple[str, ...], seed: int, trial: int, stream: int) -> np.ndarray:
    out = np.empty(len(names))
    for i, name in enumerate(names):
        digest = hashlib.blake2b(f"{seed}/{trial}/{stream}/{name}".encode(), digest_size=8).digest()
        out[i] = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal()
    return out


def perturb(
    graph: RiskGraph, percent: float, *, seed: int, trial: int, model: NoiseModel = NoiseModel.RELATIVE
) -> RiskGraph:
    """``graph`` with noisy probabilities and impacts (attackers keep their scores)."""
    zp = _normals(graph.names, seed, trial, 0)
    zi = _normals(graph.names, seed, trial, 1)
    if model is NoiseModel.RELATIVE:
        s = percent / 100.0
        prob = np.clip(graph.probability * (1.0 + s * zp), 0.0, 1.0)
        impact = np.clip(graph.impact * (1.0 + s * zi), 0.0, None)
    else:
        s = np.sqrt(abs(percent)) / 100.0
        prob = np.clip(graph.probability + s * zp, 0.0, 1.0)
        impact = np.clip(graph.impact + s * zi, 0.0, 4.0)
    prob[graph.attackers] = graph.probability[graph.attackers]
    return graph.with_scores(prob, impact)
