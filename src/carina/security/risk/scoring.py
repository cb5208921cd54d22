"""The scorer interface, the scorer registry and the one-call :func:`score`.

A scorer is any object with a ``name`` and ``score(graph) -> list[TargetScore]``
(one entry per target). Built-ins are registered lazily in :data:`SCORERS`; other
packages add theirs through the ``carina.plugins`` entry point ``risk.scorer.<name>``.
Each :class:`TargetScore` names its headline ``metric`` (higher = riskier), says
whether the value is exact, and gives certified ``bounds`` when it is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from carina.core.registry import Registry
from carina.security.risk.graph import RiskGraph
from carina.security.risk.model import Model

__all__ = ["SCORERS", "Scorer", "TargetScore", "make_scorer", "require_endpoints", "score"]


@dataclass(kw_only=True)
class TargetScore:
    """One scorer's verdict on one target.

    Attributes:
        scorer: Scorer name.
        target: Target node name.
        metric: Name of the headline figure (``risk``, ``p_reach``, ...); higher is riskier.
        value: The headline figure.
        exact: False when the value is estimated (sampling) or pruned.
        bounds: ``(low, high)`` certified or confidence bounds when not exact.
        details: Everything else the scorer found (JSON-friendly).
    """

    scorer: str
    target: str
    metric: str
    value: float
    exact: bool = True
    bounds: tuple[float, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "scorer": self.scorer,
            "target": self.target,
            "metric": self.metric,
            "value": self.value,
            "exact": self.exact,
            "bounds": list(self.bounds) if self.bounds else None,
            "details": self.details,
        }


class Scorer(Protocol):
    """Anything that scores every target of a graph."""

    name: str

    def score(self, graph: RiskGraph) -> list[TargetScore]:
        """One :class:`TargetScore` per target of ``graph``."""
        ...


def require_endpoints(graph: RiskGraph) -> None:
    """Fail clearly when a model names no attacker or no target (nothing to score)."""
    from carina.core.errors import ConfigError

    if len(graph.attackers) == 0:
        raise ConfigError("the model names no attacker (STRonG: 'attacker', carina: 'attackers')", key="attacker")
    if len(graph.targets) == 0:
        raise ConfigError("the model names no target (STRonG: 'target', carina: 'targets')", key="target")


SCORERS = Registry("risk.scorer")
SCORERS.register("strong", "carina.security.risk.strong:StrongScorer", extra="security", doc="STRonG-compatible")
SCORERS.register("reach", "carina.security.risk.reach:ReachScorer", extra="security", doc="reachability probability")
SCORERS.register("mincut", "carina.security.risk.cut:MinCutScorer", extra="security", doc="weakest-adversary cut")
SCORERS.register("kpaths", "carina.security.risk.cut:KPathsScorer", extra="security", doc="k most likely paths")


def make_scorer(name: str, **options: Any) -> Scorer:
    """Build the scorer registered as ``name`` with its config fields as options."""
    cls = SCORERS.load(name)
    scorer: Scorer = cls(cls.Config(**options)) if options else cls()
    return scorer


def score(model: Model | RiskGraph, scorer: str | Scorer = "strong", **options: Any) -> list[TargetScore]:
    """Score every target of ``model`` with ``scorer`` (a name or a scorer object)."""
    graph = model if isinstance(model, RiskGraph) else RiskGraph.from_model(model)
    impl = make_scorer(scorer, **options) if isinstance(scorer, str) else scorer
    return impl.score(graph)
