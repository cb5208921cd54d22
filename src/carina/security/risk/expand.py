"""Stencil expansion: from a :class:`Spec` to a flat, scored :class:`Model`.

The rules are STRonG's, so its examples give its numbers:

* a modifier replaces a stencil subnode by zero (remove), one (rename/rescore) or several
  (replicate) nodes; stencil links into a modified subnode go to every replacement;
* ``collapsed`` subnodes merge into ``<layer>.<instance>.grouped`` with ``cprobability``
  and ``cimpact``; its links are the union of the merged subnodes' links, and links
  into a merged subnode anywhere in the model are redirected to it;
* an instance's ``probability``/``impact`` fill subnodes that have none; its ``groups``
  replace every subnode's groups;
* a node without a probability takes its highest-priority known group's, else
  ``default_probability``; groups nobody defined are labels only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carina.core.config import Config, require
from carina.security.risk.fields import fail
from carina.security.risk.model import (
    DEFAULT_IMPACT,
    DEFAULT_PROBABILITY,
    Group,
    Instance,
    Model,
    Node,
    Spec,
)
from carina.security.risk.source import Located

__all__ = ["ExpandConfig", "expand"]

GROUPED = "grouped"


@dataclass(kw_only=True)
class ExpandConfig(Config):
    """How node scores are resolved (STRonG's ``-D``, ``-I``, ``-G`` and ``-P``).

    Attributes:
        default_probability: For nodes with neither a probability nor a known group.
        default_impact: For nodes without an impact.
        group_priority: Group probabilities win over probabilities written on nodes.
        group_overrides: Group name to probability, replacing the model's.
    """

    default_probability: float = DEFAULT_PROBABILITY
    default_impact: float = DEFAULT_IMPACT
    group_priority: bool = False
    group_overrides: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        """Check the fields."""
        require(0.0 <= self.default_probability <= 1.0, "must be in [0, 1]", key="default_probability")
        require(self.default_impact >= 0.0, "must not be negative", key="default_impact")
        for name, p in self.group_overrides.items():
            require(0.0 <= p <= 1.0, "must be in [0, 1]", key=f"group_overrides.{name}")


@dataclass
class _Sub:
    """A subnode during expansion."""

    probability: float | None
    impact: float | None
    groups: tuple[str, ...] | None
    links: list[tuple[str, Located]]  # stencil-local destinations
    where: Located


def expand(spec: Spec, config: ExpandConfig | None = None) -> Model:
    """Expand stencils, resolve scores and check every reference."""
    cfg = config or ExpandConfig()
    groups = _groups(spec, cfg)
    nodes: dict[str, Node] = {}
    raw_links: list[tuple[str, str, Located]] = []
    redirect: dict[str, str] = {}
    for inst in spec.instances:
        _check_layer(spec, inst.layer, inst.where)
        for name, sub, ext in _instantiate(spec, inst, redirect):
            _add(nodes, _score(name, inst.layer, sub, groups, cfg))
            raw_links.extend(ext)
    for ns in spec.nodes:
        _check_layer(spec, ns.layer, ns.where)
        full = f"{ns.layer}.{ns.name}"
        sub = _Sub(ns.probability, ns.impact, ns.groups, [], ns.where)
        _add(nodes, _score(full, ns.layer, sub, groups, cfg))
        raw_links.extend((full, link.dest, link.where) for link in ns.links)
    links = []
    for src, written, where in raw_links:
        dest = redirect.get(written, written)
        if dest not in nodes:
            raise fail(f"link from {src!r} to unknown node {dest!r}", where)
        if dest != src:
            links.append((src, dest, where))
    return Model(
        nodes=nodes,
        links=links,
        attackers=_endpoints(spec.attackers, nodes, redirect, "attacker"),
        targets=_endpoints(spec.targets, nodes, redirect, "target"),
        layers=dict(spec.layers),
        directed=spec.directed,
        files=list(spec.files),
    )


def _groups(spec: Spec, cfg: ExpandConfig) -> dict[str, Group]:
    out = dict(spec.groups)
    for name, p in cfg.group_overrides.items():
        old = out.get(name)
        prio = old.priority if old else -len(cfg.group_overrides) + list(cfg.group_overrides).index(name)
        out[name] = Group(name=name, probability=p, priority=prio)
    return out


def _check_layer(spec: Spec, layer: str, where: Located) -> None:
    if layer not in spec.layers:
        raise fail(f"unknown layer {layer!r} (known: {sorted(spec.layers)})", where)


def _add(nodes: dict[str, Node], node: Node) -> None:
    if node.name in nodes:
        raise fail(f"node {node.name!r} is defined twice (first at {nodes[node.name].where})", node.where)
    nodes[node.name] = node


def _endpoints(
    items: list[tuple[str, Located]], nodes: dict[str, Node], redirect: dict[str, str], what: str
) -> list[str]:
    out = []
    for written, where in items:
        name = redirect.get(written, written)
        if name not in nodes:
            raise fail(f"{what} {name!r} is not a node of the model", where)
        if name not in out:
            out.append(name)
    return out


def _score(name: str, layer: str, sub: _Sub, groups: dict[str, Group], cfg: ExpandConfig) -> Node:
    known = [groups[g] for g in sub.groups or () if g in groups]
    active = min(known, key=lambda g: g.priority) if known else None
    prob = sub.probability
    if active is not None and (prob is None or cfg.group_priority):
        prob = active.probability
    return Node(
        name=name,
        layer=layer,
        probability=cfg.default_probability if prob is None else prob,
        impact=cfg.default_impact if sub.impact is None else sub.impact,
        group=active.name if active else None,
        where=sub.where,
    )


def _instantiate(
    spec: Spec, inst: Instance, redirect: dict[str, str]
) -> list[tuple[str, _Sub, list[tuple[str, str, Located]]]]:
    """The instance's nodes as ``(full name, subnode, external links)``."""
    subs = _modified(spec, inst)
    prefix = f"{inst.layer}.{inst.name}."
    merged = _collapse(inst, subs)
    for name in merged:
        redirect[prefix + name] = prefix + GROUPED
    external: dict[str, list[tuple[str, str, Located]]] = {name: [] for name in subs}
    for link in inst.links:
        src = GROUPED if link.src in merged else link.src
        if src not in subs:
            raise fail(f"link source {link.src!r} is not a subnode of instance {inst.name!r}", link.where)
        external[src].append((prefix + src, link.dest, link.where))
    out = []
    for name, sub in subs.items():
        sub.probability = inst.probability if sub.probability is None else sub.probability
        sub.impact = inst.impact if sub.impact is None else sub.impact
        if inst.groups is not None:
            sub.groups = inst.groups
        elif sub.groups is None:
            sub.groups = inst.default_groups
        internal = [(prefix + name, prefix + (GROUPED if d in merged else d), w) for d, w in sub.links]
        out.append((prefix + name, sub, internal + external[name]))
    return out


def _modified(spec: Spec, inst: Instance) -> dict[str, _Sub]:
    stencil = spec.stencils.get(inst.stencil)
    if stencil is None:
        raise fail(f"unknown stencil {inst.stencil!r} (known: {sorted(spec.stencils)})", inst.where)
    for sub in inst.modifiers:
        if sub not in stencil.nodes:
            raise fail(f"modifier names {sub!r}, which stencil {stencil.name!r} does not have", inst.where)
    subs: dict[str, _Sub] = {}
    for sname, links in stencil.nodes.items():
        dests: list[tuple[str, Located]] = []
        for link in links:
            if link.dest not in stencil.nodes:
                raise fail(f"stencil {stencil.name!r} links {sname!r} to unknown subnode {link.dest!r}", link.where)
            reps = inst.modifiers.get(link.dest)
            names = [r.name for r in reps] if reps is not None else [link.dest]
            dests.extend((n, link.where) for n in names)
        replacements = inst.modifiers.get(sname)
        if replacements is None:
            subs[sname] = _Sub(None, None, None, list(dests), inst.where)
            continue
        for rep in replacements:
            if rep.name in subs:
                raise fail(f"instance {inst.name!r} makes two subnodes named {rep.name!r}", rep.where)
            subs[rep.name] = _Sub(rep.probability, rep.impact, rep.groups, list(dests), rep.where)
    return subs


def _collapse(inst: Instance, subs: dict[str, _Sub]) -> set[str]:
    """Merge ``inst.collapsed`` into one grouped subnode (in place); return the merged names."""
    order = list(subs) if inst.collapsed == ("*",) else list(dict.fromkeys(inst.collapsed))
    merged = set(order)
    if not merged:
        return merged
    if GROUPED in subs:
        raise fail(f"instance {inst.name!r} has a subnode named {GROUPED!r} and collapses others", inst.where)
    for name in order:
        if name not in subs:
            raise fail(f"collapsed subnode {name!r} is not a subnode of instance {inst.name!r}", inst.where)
    links: list[tuple[str, Located]] = []
    seen: set[str] = set()
    for name in order:
        for dest, where in subs.pop(name).links:
            if dest not in merged and dest not in seen:
                seen.add(dest)
                links.append((dest, where))
    subs[GROUPED] = _Sub(inst.cprobability, inst.cimpact, None, links, inst.where)
    return merged
