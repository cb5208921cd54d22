"""Typed risk models: what a YAML model says (:class:`Spec`) and what it means (:class:`Model`).

A :class:`Spec` keeps the user's building blocks: layers, scoring groups, stencils
(templates of subnodes and their links), stencil instances with their modifiers
(rename, replicate, remove a subnode) and collapse, plain nodes, attackers and
targets, each with the file:line it came from. :func:`carina.security.risk.expand.expand`
turns a spec into a :class:`Model`: a flat list of scored nodes and their links,
named ``layer.node`` or ``layer.instance.subnode`` as in STRonG.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carina.security.risk.source import Located

__all__ = [
    "DEFAULT_IMPACT",
    "DEFAULT_PROBABILITY",
    "Group",
    "Instance",
    "Layer",
    "Link",
    "Model",
    "Node",
    "NodeSpec",
    "Replacement",
    "Spec",
    "Stencil",
]

#: STRonG's defaults for a node without a probability (and no group) or impact.
DEFAULT_PROBABILITY = 0.5
DEFAULT_IMPACT = 1.0

_NOWHERE = Located("<built>", 0)


@dataclass(frozen=True, kw_only=True)
class Layer:
    """A layer of the stack; ``upper``/``lower`` name its neighbours (or ``"none"``)."""

    name: str
    upper: str = "none"
    lower: str = "none"
    where: Located = _NOWHERE


@dataclass(frozen=True, kw_only=True)
class Group:
    """A scoring group: members without their own probability take the group's.

    A lower ``priority`` wins when a node is in several groups (YAML order).
    """

    name: str
    probability: float
    priority: int
    where: Located = _NOWHERE


@dataclass(frozen=True, kw_only=True)
class Link:
    """A link to ``dest``; ``src`` names the subnode it leaves (instance links only).

    ``probability`` is read and kept (STRonG parses it too) but no scorer uses it.
    """

    dest: str
    src: str | None = None
    probability: float | None = None
    where: Located = _NOWHERE


@dataclass(frozen=True, kw_only=True)
class Stencil:
    """A template: subnode name to its links (destinations are subnode names)."""

    name: str
    nodes: dict[str, tuple[Link, ...]]
    where: Located = _NOWHERE


@dataclass(frozen=True, kw_only=True)
class Replacement:
    """One node a modifier makes of a stencil subnode (a rename is one replacement)."""

    name: str
    probability: float | None = None
    impact: float | None = None
    groups: tuple[str, ...] | None = None
    where: Located = _NOWHERE


@dataclass(frozen=True, kw_only=True)
class Instance:
    """A stencil placed in a layer under a name.

    Attributes:
        modifiers: Subnode to the nodes replacing it: one (rename or rescore), several
            (replicate) or none (remove).
        links: External links, ``src`` a (modified) subnode, ``dest`` a full node name.
        collapsed: Subnodes merged into one node named ``<instance>.grouped``.
        cprobability, cimpact: Scores of the grouped node.
        probability, impact: Defaults for every subnode of the instance.
        groups: Groups that replace every subnode's groups (STRonG's rule).
        default_groups: Groups for subnodes that have none (carina's dialect).
    """

    name: str
    stencil: str
    layer: str
    modifiers: dict[str, tuple[Replacement, ...]] = field(default_factory=dict)
    links: tuple[Link, ...] = ()
    collapsed: tuple[str, ...] = ()
    cprobability: float | None = None
    cimpact: float | None = None
    probability: float | None = None
    impact: float | None = None
    groups: tuple[str, ...] | None = None
    default_groups: tuple[str, ...] | None = None
    where: Located = _NOWHERE


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """A plain node written out by hand."""

    name: str
    layer: str
    links: tuple[Link, ...] = ()
    probability: float | None = None
    impact: float | None = None
    groups: tuple[str, ...] = ()
    where: Located = _NOWHERE


@dataclass(kw_only=True)
class Spec:
    """Everything a model file (and its includes) defines, not yet expanded."""

    layers: dict[str, Layer] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    stencils: dict[str, Stencil] = field(default_factory=dict)
    instances: list[Instance] = field(default_factory=list)
    nodes: list[NodeSpec] = field(default_factory=list)
    attackers: list[tuple[str, Located]] = field(default_factory=list)
    targets: list[tuple[str, Located]] = field(default_factory=list)
    directed: bool = False
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Node:
    """A scored node of an expanded model."""

    name: str
    layer: str
    probability: float
    impact: float
    group: str | None = None
    where: Located = _NOWHERE


@dataclass(kw_only=True)
class Model:
    """An expanded model: scored nodes, links by node name, attackers and targets.

    ``links`` keeps each written link once as ``(source, dest, where)``; whether a link
    may be walked both ways is the graph's business (:attr:`directed`).
    """

    nodes: dict[str, Node]
    links: list[tuple[str, str, Located]]
    attackers: list[str]
    targets: list[str]
    layers: dict[str, Layer] = field(default_factory=dict)
    directed: bool = False
    files: list[str] = field(default_factory=list)

    def with_probabilities(self, probabilities: dict[str, float]) -> Model:
        """A copy with some node probabilities replaced (for what-if and property tests)."""
        from dataclasses import replace

        nodes = {n: replace(v, probability=probabilities.get(n, v.probability)) for n, v in self.nodes.items()}
        return Model(
            nodes=nodes,
            links=list(self.links),
            attackers=list(self.attackers),
            targets=list(self.targets),
            layers=dict(self.layers),
            directed=self.directed,
            files=list(self.files),
        )

    def renamed(self, mapping: dict[str, str]) -> Model:
        """A copy with nodes renamed by ``mapping`` (names not in it stay)."""
        from dataclasses import replace

        def ren(name: str) -> str:
            return mapping.get(name, name)

        return Model(
            nodes={ren(n): replace(v, name=ren(n)) for n, v in self.nodes.items()},
            links=[(ren(s), ren(d), w) for s, d, w in self.links],
            attackers=[ren(a) for a in self.attackers],
            targets=[ren(t) for t in self.targets],
            layers=dict(self.layers),
            directed=self.directed,
            files=list(self.files),
        )
