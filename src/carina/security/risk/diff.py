"""What a design change does to risk: ``carina risk diff before.yml after.yml``.

For each scorer and target: both values, the change, the nodes that carry it (STRonG
risk through each node; nodes added, removed or rescored; links added or removed),
the most likely paths that appeared or disappeared, and robustness: in how many noisy
trials (``noise`` percent, see :mod:`carina.security.risk.noise`) the before/after
order of the headline value stays as without noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from carina.core.config import Config, require
from carina.security.risk.cut import most_likely_paths
from carina.security.risk.graph import RiskGraph
from carina.security.risk.model import Model
from carina.security.risk.noise import NoiseModel, perturb
from carina.security.risk.scoring import TargetScore, make_scorer

__all__ = ["DiffConfig", "diff_models"]


@dataclass(kw_only=True)
class DiffConfig(Config):
    """Options of a design diff.

    Attributes:
        scorers: Scorers to compare with.
        noise: Score noise in percent for the robustness trials (0 = none).
        noise_model: ``relative`` or STRonG's ``strong`` noise.
        trials: Noisy trials per scorer.
        seed: Noise seed.
        top: How many paths and nodes to list as causes.
    """

    scorers: list[str] = field(default_factory=lambda: ["strong", "reach", "mincut", "kpaths"])
    noise: float = 10.0
    noise_model: NoiseModel = NoiseModel.RELATIVE
    trials: int = 100
    seed: int = 0
    top: int = 5

    def validate(self) -> None:
        """Check the fields."""
        require(bool(self.scorers), "name at least one scorer", key="scorers")
        require(self.noise >= 0.0, "must be >= 0", key="noise")
        require(self.trials >= 0, "must be >= 0", key="trials")
        require(self.top > 0, "must be positive", key="top")


def diff_models(before: Model, after: Model, config: DiffConfig | None = None) -> dict[str, Any]:
    """Compare two designs; returns a JSON-friendly report."""
    cfg = config or DiffConfig()
    gb, ga = RiskGraph.from_model(before), RiskGraph.from_model(after)
    report: dict[str, Any] = {"changes": _changes(before, after), "targets": {}}
    for name in cfg.scorers:
        scorer = make_scorer(name)
        sb, sa = scorer.score(gb), scorer.score(ga)
        for b, a in zip(sb, sa, strict=False):
            entry = report["targets"].setdefault(b.target, {})
            entry[name] = _compare(b, a, cfg)
            if cfg.trials and cfg.noise > 0:
                entry[name]["robustness"] = _robustness(scorer, gb, ga, b.target, b.value, a.value, cfg)
    for target in report["targets"]:
        report["targets"][target]["paths"] = _paths(gb, ga, target, cfg.top)
    return report


def _compare(b: TargetScore, a: TargetScore, cfg: DiffConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metric": b.metric,
        "before": b.value,
        "after": a.value,
        "change": a.value - b.value,
        "ratio": a.value / b.value if b.value else None,
        "exact": b.exact and a.exact,
    }
    if b.scorer == "strong":
        keys = ("paths", "p_total", "shift", "shortest", "longest")
        out["details"] = {k: [b.details.get(k), a.details.get(k)] for k in keys}
        nb, na = b.details["node_risk"], a.details["node_risk"]
        moves = {n: na.get(n, 0.0) - nb.get(n, 0.0) for n in set(nb) | set(na)}
        ranked = sorted(moves.items(), key=lambda kv: -abs(kv[1]))[: cfg.top]
        out["causes"] = [
            {"node": n, "risk_before": nb.get(n, 0.0), "risk_after": na.get(n, 0.0), "change": d} for n, d in ranked
        ]
        out["modes"] = [b.details["modes"][:1], a.details["modes"][:1]]
    elif b.scorer == "mincut":
        out["cut"] = [b.details["cut"], a.details["cut"]]
    return out


def _robustness(
    scorer: Any, gb: RiskGraph, ga: RiskGraph, target: str, vb: float, va: float, cfg: DiffConfig
) -> dict[str, Any]:
    sign = (va > vb) - (va < vb)
    held = 0
    for trial in range(cfg.trials):
        nb = _value(scorer, perturb(gb, cfg.noise, seed=cfg.seed, trial=trial, model=cfg.noise_model), target)
        na = _value(scorer, perturb(ga, cfg.noise, seed=cfg.seed, trial=trial, model=cfg.noise_model), target)
        held += ((na > nb) - (na < nb)) == sign
    return {
        "noise_percent": cfg.noise,
        "model": cfg.noise_model.value,
        "trials": cfg.trials,
        "order_held": held / cfg.trials,
    }


def _value(scorer: Any, graph: RiskGraph, target: str) -> float:
    for s in scorer.score(graph):
        if s.target == target:
            return float(s.value)
    raise KeyError(target)


def _paths(gb: RiskGraph, ga: RiskGraph, target: str, top: int) -> dict[str, Any]:
    def rows(g: RiskGraph) -> list[tuple[tuple[str, ...], float]]:
        if target not in g.names:
            return []
        return [(tuple(g.names[v] for v in p), prob) for p, prob in most_likely_paths(g, g.index(target), top)]

    before, after = rows(gb), rows(ga)
    sb, sa = {p for p, _ in before}, {p for p, _ in after}
    return {
        "before": [{"nodes": list(p), "probability": q, "gone": p not in sa} for p, q in before],
        "after": [{"nodes": list(p), "probability": q, "new": p not in sb} for p, q in after],
    }


def _changes(before: Model, after: Model) -> dict[str, Any]:
    nb, na = before.nodes, after.nodes
    rescored = []
    for name in sorted(set(nb) & set(na)):
        x, y = nb[name], na[name]
        if (x.probability, x.impact) != (y.probability, y.impact):
            rescored.append({"node": name, "before": [x.probability, x.impact], "after": [y.probability, y.impact]})

    def pairs(m: Model) -> set[tuple[str, str]]:
        return {(s, d) if m.directed else (min(s, d), max(s, d)) for s, d, _ in m.links}

    lb, la = pairs(before), pairs(after)
    return {
        "nodes_added": sorted(set(na) - set(nb)),
        "nodes_removed": sorted(set(nb) - set(na)),
        "nodes_rescored": rescored,
        "links_added": sorted(la - lb),
        "links_removed": sorted(lb - la),
    }
