"""Loading both dialects, stencil expansion and errors that point at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.core.errors import ModelFormatError
from carina.security.risk.graph import RiskGraph
from carina.security.risk.loader import load_model, loads_model
from carina.security.risk.model import Model
from carina.security.risk.scoring import score
from carina.testing import shared_data

HAND_EXPANDED = """
target: [baselayer.node1]
attacker: [baselayer.node2]
baselayer: {type: layer}
groups: [{groupA: 0.41}, {groupB: 0.42}, {groupC: 0.43}]
inst.core: {layer: baselayer, links: [{d: baselayer.inst.comm}, {d: baselayer.inst.comm2},
            {d: baselayer.inst.memory}, {d: baselayer.inst.syscall}]}
inst.comm: {layer: baselayer, groups: [groupB, groupA], links: [{d: baselayer.inst.core}, {d: baselayer.node1}]}
inst.comm2: {layer: baselayer, probability: 0.666, impact: 3.22,
             links: [{d: baselayer.inst.core}, {d: baselayer.node2}]}
inst.memory: {layer: baselayer, links: [{d: baselayer.inst.core}, {d: baselayer.os.memory}]}
inst.syscall: {layer: baselayer, links: [{d: baselayer.inst.core}, {d: baselayer.os.grouped}]}
os.drivers: {layer: baselayer, groups: [groupC], links: [{d: baselayer.os.memory}, {d: baselayer.os.grouped}]}
os.memory: {layer: baselayer, groups: [groupC], probability: 0.7, impact: 2.0,
            links: [{d: baselayer.os.grouped}, {d: baselayer.os.drivers}, {d: baselayer.inst.memory}]}
os.grouped: {layer: baselayer, groups: [groupC], probability: 0.25, impact: 3.888,
             links: [{d: baselayer.os.memory}, {d: baselayer.os.drivers}, {d: baselayer.inst.syscall}]}
node1: {layer: baselayer, groups: [groupA, groupC], links: [{d: baselayer.inst.comm}]}
node2: {layer: baselayer, probability: 0.1, impact: 2.333, groups: [groupB], links: [{d: baselayer.inst.memory}]}
node3: {layer: baselayer, probability: 0.8, impact: 1.8, links: [{d: baselayer.inst.syscall}, {d: baselayer.node1}]}
"""

CARINA_TESTCASE = """
carina: 1
layers: [baselayer]
groups: {groupA: 0.41, groupB: 0.42, groupC: 0.43}
stencils:
  process: {core: [comm, memory, syscall], comm: [core], memory: [core], syscall: [core]}
  linux:
    syscall: [memorymgt, processmgt, network, filesys, drivers, memory]
    memorymgt: [memory, processmgt, network, filesys, drivers, syscall]
    processmgt: [memory, memorymgt, syscall]
    network: [memory, memorymgt, drivers, syscall, filesys]
    filesys: [memory, memorymgt, drivers, network, syscall]
    drivers: [memory, memorymgt, network, filesys, syscall]
    memory: [memorymgt, processmgt, syscall, network, filesys, drivers]
components:
  inst:
    stencil: process
    layer: baselayer
    replicate: {comm: [comm, comm2]}
    scores: {comm: {groups: [groupB, groupA]}, comm2: {probability: 0.666, impact: 3.22}}
    links: {comm: [baselayer.node1], comm2: [baselayer.node2], syscall: [baselayer.os.network],
            memory: [baselayer.os.memory]}
  os:
    stencil: linux
    layer: baselayer
    groups: [groupC]
    scores: {memory: {probability: 0.7, impact: 2.0}}
    collapse: {nodes: [network, syscall, processmgt, memorymgt, filesys], probability: 0.25, impact: 3.888}
    links: {syscall: [baselayer.inst.syscall], memory: [baselayer.inst.memory]}
nodes:
  node1: {layer: baselayer, groups: [groupA, groupC], links: [baselayer.inst.comm]}
  node2: {layer: baselayer, probability: 0.1, impact: 2.333, groups: [groupB], links: [baselayer.inst.memory]}
  node3: {layer: baselayer, probability: 0.8, impact: 1.8, links: [baselayer.inst.syscall, baselayer.node1]}
attackers: [baselayer.node2]
targets: [baselayer.node1]
"""


def _shape(m: Model) -> tuple[dict[str, tuple[float, float]], set[frozenset[str]]]:
    nodes = {n.name: (n.probability, n.impact) for n in m.nodes.values()}
    return nodes, {frozenset((s, d)) for s, d, _ in m.links}


def test_stencil_expansion_equals_hand_expanded_model() -> None:
    expanded = load_model(shared_data("strong") / "test" / "testcase.yml")
    by_hand = loads_model(HAND_EXPANDED)
    assert _shape(expanded) == _shape(by_hand)
    assert score(expanded)[0].value == score(by_hand)[0].value


def test_carina_dialect_reads_the_same_model() -> None:
    strong = load_model(shared_data("strong") / "test" / "testcase.yml")
    ours = loads_model(CARINA_TESTCASE)
    assert _shape(strong) == _shape(ours)
    assert (ours.attackers, ours.targets) == (strong.attackers, strong.targets)


def test_includes_are_relative_and_shared_examples_load() -> None:
    m = load_model(shared_data("strong") / "openstack" / "openstack_shc_CFA.yml")
    assert len(m.nodes) == 42
    assert m.nodes["os.computeOS.grouped"].probability == 0.1767
    assert m.nodes["services.protocheck.plugin"].probability == 0.0737
    assert "services.protocheck.memory" not in m.nodes  # removed by an empty modifier
    g = RiskGraph.from_model(m)
    assert g.out_degree[g.index("os.computeOS.grouped")] == 10  # 8 own links + memiso, vmiso


def _error(tmp_path: Path, files: dict[str, str], main: str = "main.yml") -> ModelFormatError:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ModelFormatError) as info:
        load_model(tmp_path / main)
    return info.value


BASE = "l: {type: layer}\nattacker: [l.a]\ntarget: [l.b]\na: {layer: l, links: [{d: l.b}]}\n"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (BASE + "b: {layer: l, links: [{d: l.nowhere}]}\n", 5, "unknown node 'l.nowhere'"),
        (BASE + "b: {layer: l, probability: 1.5}\n", 5, "not a probability"),
        (BASE + "b: {layer: l, probability: high}\n", 5, "must be a number"),
        (BASE + "b: {layer: l}\nc: {layer: l, stencil: ghost}\n", 6, "unknown stencil 'ghost'"),
        (BASE + "b: {layer: l}\nb: {layer: l}\n", 6, "duplicate key 'b'"),
        (BASE + "b: {layer: nolayer}\n", 5, "unknown layer"),
        (BASE + "b: {layer: l, colour: red}\n", 5, "unknown key 'colour'"),
        (BASE + "b: {layer: l, links: [{d: l.a}\n", 6, "YAML syntax error"),
        (BASE.replace("target: [l.b]", "target: [l.zz]") + "b: {layer: l}\n", 3, "target 'l.zz'"),
    ],
)
def test_bad_models_point_at_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    err = _error(tmp_path, {"main.yml": text})
    assert err.context["file"].endswith("main.yml")
    assert err.context["line"] == line
    assert words in str(err)


def test_include_cycle_names_the_chain(tmp_path: Path) -> None:
    err = _error(
        tmp_path, {"main.yml": "includes: [a.yml]\n", "a.yml": "includes:\n  - b.yml\n", "b.yml": "includes: [a.yml]\n"}
    )
    assert "include cycle" in str(err) and "a.yml -> b.yml -> a.yml" in str(err)
    assert err.context["file"].endswith("b.yml") and err.context["line"] == 1


def test_missing_include_points_at_the_include_line(tmp_path: Path) -> None:
    err = _error(tmp_path, {"main.yml": "# models\nincludes:\n  - gone.yml\n"})
    assert err.context["line"] == 3 and "gone.yml" in str(err)


def test_errors_in_included_files_name_that_file(tmp_path: Path) -> None:
    files = {
        "main.yml": "includes: [parts.yml]\n" + BASE + "b: {layer: l}\n",
        "parts.yml": "s:\n  type: stencil\n  x: {links: [{d: y}]}\n",
    }
    (tmp_path / "main.yml").write_text(files["main.yml"] + "c: {layer: l, stencil: s}\n")
    (tmp_path / "parts.yml").write_text(files["parts.yml"])
    with pytest.raises(ModelFormatError) as info:
        load_model(tmp_path / "main.yml")
    assert info.value.context["file"].endswith("parts.yml") and info.value.context["line"] == 3
    assert "unknown subnode 'y'" in str(info.value)


def test_carina_dialect_errors(tmp_path: Path) -> None:
    text = "carina: 1\nlayers: [l]\ncomponents:\n  c: {stencil: s, layer: l, rename: {x: y}, remove: [x]}\n"
    err = _error(tmp_path, {"main.yml": "carina: 1\nlayers: [l]\nstencils: {s: {x: []}}\n" + text.split("\n", 2)[2]})
    assert "modified twice" in str(err) and err.context["line"] == 5


def test_group_overrides_and_priority_like_strong_flags() -> None:
    from carina.security.risk.expand import ExpandConfig

    path = shared_data("strong") / "test" / "testcase.yml"
    base = load_model(path)
    assert base.nodes["baselayer.node1"].probability == 0.41  # groupA
    over = load_model(path, ExpandConfig(group_overrides={"groupA": 0.9}))
    assert over.nodes["baselayer.node1"].probability == 0.9
    assert over.nodes["baselayer.node2"].probability == 0.1  # its own probability wins by default
    prio = load_model(path, ExpandConfig(group_priority=True))
    assert prio.nodes["baselayer.node2"].probability == 0.42  # -G: the group wins


@pytest.mark.parametrize("scorer", ["strong", "reach", "mincut", "kpaths"])
def test_a_model_without_attackers_is_a_clear_error(scorer: str) -> None:
    from carina.core.errors import ConfigError

    model = loads_model("l: {type: layer}\ntarget: [l.b]\na: {layer: l, links: [{d: l.b}]}\nb: {layer: l}\n")
    with pytest.raises(ConfigError, match="no attacker"):
        score(model, scorer)
