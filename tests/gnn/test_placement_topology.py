import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import ModelFormatError
from carina.gnn.placement.discover import add_sysfs_nvme, from_nvidia_smi, parse_nvidia_smi
from carina.gnn.placement.topology import BUILTINS, NodeKind, builtin, from_json
from carina.testing.gnn import fake_topology

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtins_validate_and_round_trip(name):
    t = builtin(name)
    t.validate()
    back = from_json(json.dumps(t.to_dict()))
    assert back.to_dict() == t.to_dict()
    assert t.simulated


def test_pcie_server_shape():
    t = fake_topology("pcie-8gpu-2socket")
    assert t.simulated
    assert len(t.of_kind(NodeKind.GPU)) == 8 and len(t.of_kind(NodeKind.SSD)) == 8
    assert len(t.of_kind(NodeKind.SWITCH)) == 4 and len(t.of_kind(NodeKind.CPU)) == 2


def test_unknown_builtin_lists_choices():
    with pytest.raises(ModelFormatError, match="pcie-8gpu-2socket"):
        builtin("dgx-9000")


@pytest.mark.parametrize(
    "doc,key",
    [
        ({"nodes": [{"name": "a", "kind": "gpu"}], "links": [{"src": "a", "dst": "b", "gbps": 1}]}, "links[0]"),
        ({"nodes": [{"name": "a", "kind": "toaster"}], "links": []}, "nodes[0]"),
        (
            {
                "nodes": [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "cpu"}],
                "links": [{"src": "a", "dst": "b", "gbps": 0}],
            },
            "links[0]",
        ),
        (
            {
                "nodes": [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "cpu"}],
                "links": [{"src": "a", "dst": "b", "gbps": 1}, {"src": "a", "dst": "b", "gbps": 2}],
            },
            "links[1]",
        ),
    ],
)
def test_bad_json_names_the_entry(doc, key):
    with pytest.raises(ModelFormatError) as err:
        from_json(doc)
    assert err.value.context["key"] == key


def test_bad_json_text():
    with pytest.raises(ModelFormatError):
        from_json("{nope")
    with pytest.raises(ModelFormatError, match="unknown key"):
        from_json({"nodes": [], "links": [], "extra": 1})


@settings(max_examples=40, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    )
)
def test_fuzz_json_only_raises_model_format_error(doc):
    try:
        from_json(doc)
    except ModelFormatError:
        pass


def test_nvidia_smi_dgx():
    t = from_nvidia_smi((FIX / "topo_dgx_h100.txt").read_text())
    assert not t.simulated
    assert len(t.of_kind(NodeKind.GPU)) == 8 and len(t.of_kind(NodeKind.CPU)) == 2
    nv = [x for x in t.links if x.src == "gpu0" and x.dst.startswith("gpu")]
    assert len(nv) == 7 and all(x.gbps == 18 * 25.0 for x in nv)
    assert {t.nodes[f"gpu{i}"].socket for i in range(4)} == {0} and t.nodes["gpu7"].socket == 1


def test_nvidia_smi_pcie_switches():
    t = from_nvidia_smi((FIX / "topo_pcie_4gpu.txt").read_text())
    assert len(t.of_kind(NodeKind.SWITCH)) == 2
    assert {x.dst for x in t.links_of("gpu0")} == {"sw0"}
    assert {x.dst for x in t.links_of("gpu2")} == {"sw1"}
    assert ("cpu0", "cpu1") in {(x.src, x.dst) for x in t.links}


@pytest.mark.parametrize("name", ["topo_h100_single.txt", "topo_h100_real.txt"])
def test_nvidia_smi_single_gpu(name):
    # topo_h100_real.txt is the H100 machine's own output, header underlined with ANSI escapes
    t = from_nvidia_smi((FIX / name).read_text())
    assert {x.dst for x in t.links_of("gpu0")} == {"cpu0"}


@pytest.mark.parametrize(
    "text,match",
    [
        ("hello\nworld\n", "no header"),
        ("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tQQQ\t0\nGPU1\tQQQ\t X \t0\n", "unknown relation"),
        ("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tPIX\t0\n", "GPU rows"),
    ],
)
def test_nvidia_smi_errors(text, match):
    with pytest.raises(ModelFormatError, match=match):
        parse_nvidia_smi(text)


def test_sysfs_nvme(tmp_path):
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "class").write_text("0x010802\n")
    (dev / "numa_node").write_text("1\n")
    (dev / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (dev / "current_link_width").write_text("4\n")
    other = tmp_path / "bus" / "pci" / "devices" / "0000:02:00.0"
    other.mkdir()
    (other / "class").write_text("0x030200\n")
    t = from_nvidia_smi((FIX / "topo_pcie_4gpu.txt").read_text())
    assert add_sysfs_nvme(t, sysfs=tmp_path) == ["ssd0"]
    (link,) = t.links_of("ssd0")
    assert link.dst == "cpu1" and link.gbps == pytest.approx(16 * 4 * 128 / 130 / 8)


def test_apply_measured_rates():
    from carina.gnn.placement.discover import apply_measured

    t = apply_measured(from_nvidia_smi((FIX / "topo_h100_real.txt").read_text()), pcie_gbps=53.6, disk_gbps=1.54)
    rates = {(x.src, x.dst): x.gbps for x in t.links}
    assert rates[("gpu0", "cpu0")] == rates[("cpu0", "gpu0")] == 53.6
    assert rates[("ssd0", "cpu0")] == 1.54 and rates[("dram0", "cpu0")] == 100.0
