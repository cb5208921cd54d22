"""Reader of carina's own model dialect: explicit sections, one meaning per key.

```text
carina: 1                       # marks the dialect
includes: [stencils.yml]        # read first, relative to this file
directed: false                 # links walkable both ways (STRonG's default)
layers: [services, os, net]     # top to bottom
groups: {Gamqp: 0.3188}         # order = priority
stencils:
  process: {core: [comm, syscall], comm: [core], syscall: [core]}
components:                     # stencil instances
  broker:
    stencil: process
    layer: services
    rename: {comm: amqp}        # also: replicate {comm: [a, b]}, remove [syscall]
    groups: [Gcore]             # for subnodes without groups of their own
    scores: {amqp: {probability: 0.3188, impact: 2.167, groups: [Gamqp]}}
    collapse: {nodes: all, probability: 0.1767, impact: 4.0}
    links: {amqp: [net.eth]}    # subnode -> full names
nodes:
  eth: {layer: net, probability: 0.1388, impact: 2.5, links: [services.broker.amqp]}
attackers: [net.eth]
targets: [services.broker.core]
```
Sections merge across included files; names must be unique.
"""

from __future__ import annotations

from typing import Any

from carina.security.risk.fields import (
    fail,
    read_impact,
    read_mapping,
    read_name,
    read_names,
    read_probability,
    reject_unknown,
)
from carina.security.risk.model import Group, Instance, Layer, Link, NodeSpec, Replacement, Spec, Stencil
from carina.security.risk.source import Located, LocatedDict, LocatedList, SourceFile

__all__ = ["read_carina"]

_TOP = ("carina", "includes", "directed", "layers", "groups", "stencils", "components", "nodes", "attackers", "targets")
_COMPONENT: tuple[str, ...] = ("stencil", "layer", "rename", "replicate", "remove", "scores", "collapse", "links")
_COMPONENT += ("probability", "impact", "groups", "comment")
_SCORES = ("probability", "impact", "groups")


def read_carina(files: list[SourceFile]) -> Spec:
    """Build a :class:`Spec` from carina-dialect files (includes first, main file last)."""
    spec = Spec(files=[str(f.path) for f in files])
    for f in files:
        data = f.data
        reject_unknown(data, _TOP, "a carina model")
        if data.get("carina") not in (None, 1):
            raise fail(
                f"unsupported carina dialect version {data['carina']!r} (this reader knows 1)", data.at("carina")
            )
        if "directed" in data:
            if not isinstance(data["directed"], bool):
                raise fail("directed must be true or false", data.at("directed"))
            spec.directed = data["directed"]
        _read_layers(spec, data.get("layers"), data.at("layers"))
        for gname, gp, where in _pairs(data.get("groups"), "groups", data.at("groups")):
            if gname in spec.groups:
                raise fail(f"group {gname!r} is defined twice", where)
            p = read_probability(gp, f"probability of group {gname!r}", where)
            if p is None:
                raise fail(f"group {gname!r} has no probability", where)
            spec.groups[gname] = Group(name=gname, probability=p, priority=len(spec.groups), where=where)
        for sname, body, where in _pairs(data.get("stencils"), "stencils", data.at("stencils")):
            if sname in spec.stencils:
                raise fail(f"stencil {sname!r} is defined twice", where)
            spec.stencils[sname] = _read_stencil(sname, body, where)
        for cname, body, where in _pairs(data.get("components"), "components", data.at("components")):
            spec.instances.append(_read_component(cname, body, where))
        for nname, body, where in _pairs(data.get("nodes"), "nodes", data.at("nodes")):
            spec.nodes.append(_read_node(nname, body, where))
        for key, out in (("attackers", spec.attackers), ("targets", spec.targets)):
            value = data.get(key)
            names = read_names(value, key[:-1], data.at(key))
            places = value.item_where if isinstance(value, LocatedList) else [data.at(key)] * len(names)
            out.extend(zip(names, places, strict=True))
    return spec


def _pairs(value: Any, what: str, where: Located) -> list[tuple[str, Any, Located]]:
    if value is None:
        return []
    data = read_mapping(value, what, where)
    return [(read_name(k, f"name in {what}", data.at(k)), v, data.at(k)) for k, v in data.items()]


def _read_layers(spec: Spec, value: Any, where: Located) -> None:
    if value is None:
        return
    if not isinstance(value, LocatedList):
        raise fail("layers must be a list, top to bottom", where)
    names = [read_name(v, "layer", value.at(i)) for i, v in enumerate(value)]
    for i, name in enumerate(names):
        if name in spec.layers:
            raise fail(f"layer {name!r} is defined twice", value.at(i))
        upper = names[i - 1] if i > 0 else "none"
        lower = names[i + 1] if i + 1 < len(names) else "none"
        spec.layers[name] = Layer(name=name, upper=upper, lower=lower, where=value.at(i))


def _read_stencil(name: str, body: Any, where: Located) -> Stencil:
    nodes = {}
    for sub, dests, at in _pairs(body, f"stencil {name!r}", where):
        places = dests.item_where if isinstance(dests, LocatedList) else []
        names = read_names(dests, "linked subnode", at)
        nodes[sub] = tuple(Link(dest=d, where=places[i] if places else at) for i, d in enumerate(names))
    return Stencil(name=name, nodes=nodes, where=where)


def _read_node(name: str, body: Any, where: Located) -> NodeSpec:
    data = read_mapping(body, f"node {name!r}", where)
    reject_unknown(data, ("layer", "links", *_SCORES, "comment"), f"node {name!r}")
    if "layer" not in data:
        raise fail(f"node {name!r} has no layer", where)
    dests = data.get("links")
    places = dests.item_where if isinstance(dests, LocatedList) else []
    links = read_names(dests, "link destination", data.at("links"))
    return NodeSpec(
        name=name,
        layer=read_name(data["layer"], "layer", data.at("layer")),
        links=tuple(Link(dest=d, where=places[i] if places else data.at("links")) for i, d in enumerate(links)),
        probability=read_probability(data.get("probability"), f"probability of {name!r}", data.at("probability")),
        impact=read_impact(data.get("impact"), f"impact of {name!r}", data.at("impact")),
        groups=read_names(data.get("groups"), "group", data.at("groups")),
        where=where,
    )


def _read_component(name: str, body: Any, where: Located) -> Instance:
    data = read_mapping(body, f"component {name!r}", where)
    reject_unknown(data, _COMPONENT, f"component {name!r}")
    for key in ("stencil", "layer"):
        if key not in data:
            raise fail(f"component {name!r} has no {key}", where)
    modifiers = _modifiers(data)
    collapsed, cprob, cimpact = _collapse(data, modifiers)
    links = []
    for sub, dests, at in _pairs(data.get("links"), f"links of {name!r}", data.at("links")):
        places = dests.item_where if isinstance(dests, LocatedList) else []
        for i, dest in enumerate(read_names(dests, "link destination", at)):
            links.append(Link(dest=dest, src=sub, where=places[i] if places else at))
    groups = read_names(data["groups"], "group", data.at("groups")) if "groups" in data else None
    return Instance(
        name=name,
        stencil=read_name(data["stencil"], "stencil", data.at("stencil")),
        layer=read_name(data["layer"], "layer", data.at("layer")),
        modifiers=modifiers,
        links=tuple(links),
        collapsed=collapsed,
        cprobability=cprob,
        cimpact=cimpact,
        probability=read_probability(data.get("probability"), "probability", data.at("probability")),
        impact=read_impact(data.get("impact"), "impact", data.at("impact")),
        default_groups=groups,
        where=where,
    )


def _modifiers(data: LocatedDict) -> dict[str, tuple[Replacement, ...]]:
    plan: dict[str, list[str]] = {}
    origin: dict[str, Located] = {}

    def put(sub: str, names: list[str], at: Located) -> None:
        if sub in plan:
            raise fail(f"subnode {sub!r} is modified twice (first at {origin[sub]})", at)
        plan[sub], origin[sub] = names, at

    for sub, new, at in _pairs(data.get("rename"), "rename", data.at("rename")):
        put(sub, [read_name(new, "new name", at)], at)
    for sub, new, at in _pairs(data.get("replicate"), "replicate", data.at("replicate")):
        put(sub, list(read_names(new, "replica name", at)), at)
    for sub in read_names(data.get("remove"), "removed subnode", data.at("remove")):
        put(sub, [], data.at("remove"))
    scores = {n: (v, at) for n, v, at in _pairs(data.get("scores"), "scores", data.at("scores"))}
    finals = {n for names in plan.values() for n in names}
    for sub, (_, at) in scores.items():  # rescoring an unmodified subnode renames it to itself
        if sub not in finals:
            put(sub, [sub], at)
    out = {}
    for sub, names in plan.items():
        out[sub] = tuple(_replacement(n, scores.get(n), origin[sub]) for n in names)
    return out


def _replacement(name: str, scored: tuple[Any, Located] | None, at: Located) -> Replacement:
    if scored is None:
        return Replacement(name=name, where=at)
    body, where = scored
    s = read_mapping(body, f"scores of {name!r}", where)
    reject_unknown(s, _SCORES, f"scores of {name!r}")
    return Replacement(
        name=name,
        probability=read_probability(s.get("probability"), f"probability of {name!r}", s.at("probability")),
        impact=read_impact(s.get("impact"), f"impact of {name!r}", s.at("impact")),
        groups=read_names(s["groups"], "group", s.at("groups")) if "groups" in s else None,
        where=where,
    )


def _collapse(data: LocatedDict, modifiers: dict[str, tuple[Replacement, ...]]) -> tuple[tuple[str, ...], Any, Any]:
    if "collapse" not in data:
        return (), None, None
    c = read_mapping(data["collapse"], "collapse", data.at("collapse"))
    reject_unknown(c, ("nodes", "probability", "impact"), "collapse")
    nodes: tuple[str, ...] = ("*",) if c.get("nodes", "all") == "all" else read_names(c["nodes"], "node", c.at("nodes"))
    prob = read_probability(c.get("probability"), "collapse probability", c.at("probability"))
    impact = read_impact(c.get("impact"), "collapse impact", c.at("impact"))
    return nodes, prob, impact
