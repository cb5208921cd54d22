"""Reader of STRonG's YAML dialect, as IBM's examples write it.

Top-level keys ``includes``, ``attacker``, ``target`` and ``groups`` (a list of
``{name: probability}``, order = priority); every other key names a layer
(``type: layer``), a stencil (``type: stencil``, subnodes with ``links: [{d: ...}]``),
a stencil instance (has ``stencil:``) or a plain node. Instances carry
``modifier`` (``- subnode: [{n: name, p: prob, i: impact, g: group(s)}]``, an empty
list removes the subnode), ``links`` (``{s: subnode, d: full.name}``), ``collapsed``
with ``cprobability``/``cimpact``, and defaults ``probability``/``impact``/``groups``.
"""

from __future__ import annotations

from typing import Any

from carina.security.risk.fields import (
    fail,
    read_impact,
    read_links,
    read_mapping,
    read_name,
    read_names,
    read_probability,
    reject_unknown,
)
from carina.security.risk.model import Group, Instance, Layer, NodeSpec, Replacement, Spec, Stencil
from carina.security.risk.source import Located, LocatedDict, LocatedList, SourceFile

__all__ = ["is_strong", "read_strong"]

_LINK_KEYS = {"dest_key": "d", "src_key": "s", "prob_key": "p"}
_NODE_KEYS = ("layer", "links", "probability", "impact", "groups", "comment")
_INSTANCE_KEYS = (
    "stencil",
    "layer",
    "modifier",
    "links",
    "collapsed",
    "cprobability",
    "cimpact",
    "probability",
    "impact",
    "groups",
    "comment",
)
_RESERVED = ("includes", "attacker", "target", "groups")


def is_strong(data: LocatedDict) -> bool:
    """Whether a parsed file is written in STRonG's dialect (not carina's)."""
    return "carina" not in data


def read_strong(files: list[SourceFile]) -> Spec:
    """Build a :class:`Spec` from STRonG-dialect files (includes first, main file last)."""
    spec = Spec(files=[str(f.path) for f in files])
    owner: dict[str, Located] = {}
    entries: list[tuple[str, LocatedDict]] = []
    for f in files:
        data = f.data
        for key, value in data.items():
            if key == "includes":
                continue
            if key in _RESERVED:
                _read_reserved(spec, key, value, data.at(key))
                continue
            name = read_name(key, "entry name", data.at(key))
            if name in owner:
                raise fail(f"{name!r} is defined twice (first at {owner[name]})", data.at(key))
            owner[name] = data.at(key)
            entries.append((name, read_mapping(value, f"entry {name!r}", data.at(key))))
    for name, body in entries:  # layers and stencils first: STRonG's first pass
        if "type" in body:
            _read_typed(spec, name, body)
    for name, body in entries:
        if "type" in body:
            continue
        if "stencil" in body:
            spec.instances.append(_read_instance(name, body))
        else:
            spec.nodes.append(_read_node(name, body))
    return spec


def _read_reserved(spec: Spec, key: str, value: Any, where: Located) -> None:
    if key == "groups":
        _read_groups(spec, value, where)
        return
    names = read_names(value, key, where)
    items = value.item_where if isinstance(value, LocatedList) else [where] * len(names)
    target = spec.attackers if key == "attacker" else spec.targets
    target.extend(zip(names, items, strict=True))


def _read_groups(spec: Spec, value: Any, where: Located) -> None:
    if value is None:
        return
    if not isinstance(value, LocatedList):
        raise fail("groups must be a list of {name: probability}", where)
    base = len(spec.groups)
    for index, item in enumerate(value):
        entry = read_mapping(item, "a group entry", value.at(index))
        for name, prob in entry.items():
            gname = read_name(name, "group name", entry.at(name))
            if gname in spec.groups:
                raise fail(f"group {gname!r} is defined twice (first at {spec.groups[gname].where})", entry.at(name))
            p = read_probability(prob, f"probability of group {gname!r}", entry.at(name))
            if p is None:
                raise fail(f"group {gname!r} has no probability", entry.at(name))
            spec.groups[gname] = Group(name=gname, probability=p, priority=base + index, where=entry.at(name))


def _read_typed(spec: Spec, name: str, body: LocatedDict) -> None:
    kind = str(body["type"]).lower()
    if kind == "layer":
        reject_unknown(body, ("type", "upper", "lower", "comment"), f"layer {name!r}")
        upper = str(body.get("upper", "none")).lower()
        lower = str(body.get("lower", "none")).lower()
        spec.layers[name] = Layer(name=name, upper=upper, lower=lower, where=body.where)
    elif kind == "stencil":
        spec.stencils[name] = _read_stencil(name, body)
    else:
        raise fail(f"unknown type {body['type']!r} for {name!r} (expected layer or stencil)", body.at("type"))


def _read_stencil(name: str, body: LocatedDict) -> Stencil:
    nodes = {}
    for sub, data in body.items():
        if sub in ("type", "comment"):
            continue
        sname = read_name(sub, "stencil subnode", body.at(sub))
        sdata = read_mapping(data, f"subnode {sname!r} of stencil {name!r}", body.at(sub))
        reject_unknown(sdata, ("links", "comment"), f"subnode {sname!r} of stencil {name!r}")
        nodes[sname] = read_links(sdata.get("links"), sdata.at("links"), **_LINK_KEYS)
    return Stencil(name=name, nodes=nodes, where=body.where)


def _read_node(name: str, body: LocatedDict) -> NodeSpec:
    reject_unknown(body, _NODE_KEYS, f"node {name!r}")
    if "layer" not in body:
        raise fail(f"node {name!r} has no layer", body.where)
    return NodeSpec(
        name=name,
        layer=read_name(body["layer"], "layer", body.at("layer")),
        links=read_links(body.get("links"), body.at("links"), **_LINK_KEYS),
        probability=read_probability(body.get("probability"), f"probability of {name!r}", body.at("probability")),
        impact=read_impact(body.get("impact"), f"impact of {name!r}", body.at("impact")),
        groups=read_names(body.get("groups"), "group", body.at("groups")),
        where=body.where,
    )


def _read_instance(name: str, body: LocatedDict) -> Instance:
    reject_unknown(body, _INSTANCE_KEYS, f"instance {name!r}")
    if "layer" not in body:
        raise fail(f"instance {name!r} has no layer", body.where)
    links = read_links(body.get("links"), body.at("links"), **_LINK_KEYS)
    for link in links:
        if link.src is None:
            raise fail(f"a link of instance {name!r} needs a source subnode 's'", link.where)
    groups = read_names(body["groups"], "group", body.at("groups")) if "groups" in body else None
    at = body.at
    return Instance(
        name=name,
        stencil=read_name(body["stencil"], "stencil", at("stencil")),
        layer=read_name(body["layer"], "layer", at("layer")),
        modifiers=_read_modifiers(body.get("modifier"), at("modifier")),
        links=links,
        collapsed=read_names(body.get("collapsed"), "collapsed subnode", at("collapsed")),
        cprobability=read_probability(body.get("cprobability"), "cprobability", at("cprobability")),
        cimpact=read_impact(body.get("cimpact"), "cimpact", at("cimpact")),
        probability=read_probability(body.get("probability"), "probability", at("probability")),
        impact=read_impact(body.get("impact"), "impact", at("impact")),
        groups=groups,
        where=body.where,
    )


def _read_modifiers(value: Any, where: Located) -> dict[str, tuple[Replacement, ...]]:
    if value is None:
        return {}
    if not isinstance(value, LocatedList):
        raise fail("modifier must be a list of {subnode: [replacements]}", where)
    out: dict[str, tuple[Replacement, ...]] = {}
    for index, item in enumerate(value):
        entry = read_mapping(item, "a modifier", value.at(index))
        for sub, reps in entry.items():
            sname = read_name(sub, "modified subnode", entry.at(sub))
            if reps is None:
                out[sname] = ()
                continue
            if not isinstance(reps, LocatedList):
                raise fail(f"modifier of {sname!r} must be a list", entry.at(sub))
            out[sname] = tuple(_read_replacement(r, reps.at(i), sname) for i, r in enumerate(reps))
    return out


def _read_replacement(value: Any, where: Located, sub: str) -> Replacement:
    data = read_mapping(value, f"a replacement of {sub!r}", where)
    reject_unknown(data, ("n", "p", "i", "g"), f"a replacement of {sub!r}")
    name = read_name(data["n"], "replacement name", data.at("n")) if "n" in data else sub
    return Replacement(
        name=name,
        probability=read_probability(data.get("p"), f"probability of {name!r}", data.at("p")),
        impact=read_impact(data.get("i"), f"impact of {name!r}", data.at("i")),
        groups=read_names(data["g"], "group", data.at("g")) if "g" in data else None,
        where=data.where,
    )
