from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import ModelFormatError
from carina.gnn.placement.lspci import from_lspci, parse_lspci_tree, parse_lspci_vmm
from carina.gnn.placement.schedule import Demand, schedule_lp
from carina.gnn.placement.topology import NodeKind

FIX = Path(__file__).parent / "fixtures"
TREE = (FIX / "lspci_tv_8gpu_2socket.txt").read_text()  # composed: 8 A100 behind 4 PEX switches, 2 sockets
VMM = (FIX / "lspci_vmm_8gpu_2socket.txt").read_text()
VM_TREE = (FIX / "lspci_tv_local_vm.txt").read_text()  # real output of the CI VM (no bridges)
VM_VMM = (FIX / "lspci_vmm_local_vm.txt").read_text()


def test_tree_addresses_and_parents():
    devs = parse_lspci_tree(TREE)
    gpu = devs["0000:1a:00.0"]
    assert gpu.vendor == "10de" and gpu.device == "20b5" and not gpu.is_bridge
    chain = []
    node = gpu.bdf
    while devs[node].parent is not None:
        node = devs[node].parent or ""
        chain.append(node)
    assert chain == ["0000:19:00.0", "0000:18:00.0", "0000:17:00.0", "0000:17"]
    assert devs["0000:19:00.0"].children == ["0000:1a:00.0"]
    assert devs["0000:18:00.0"].children == ["0000:19:00.0", "0000:19:04.0", "0000:19:08.0"]
    assert devs["0000:00:1c.5"].secondary == 2 and devs["0000:03:00.0"].name.startswith("ASPEED")
    roots = [b for b, d in devs.items() if d.parent is None]
    assert roots == ["0000:d7", "0000:ae", "0000:85", "0000:80", "0000:5d", "0000:3a", "0000:17", "0000:00"]


def test_eight_gpu_server_shape():
    topo = from_lspci(TREE, VMM)
    gpus, ssds = topo.of_kind(NodeKind.GPU), topo.of_kind(NodeKind.SSD)
    assert len(gpus) == 8 and len(ssds) == 4 and len(topo.of_kind(NodeKind.SWITCH)) == 4
    assert len(topo.of_kind(NodeKind.NIC)) == 3  # two ConnectX-6 behind switches, the I350 on a root port
    assert [topo.nodes[g].socket for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    up = {link.src: link.dst for link in topo.links if link.src in gpus + ssds}
    assert up["gpu0"] == up["gpu1"] == up["ssd0"] == "sw0"
    assert up["gpu6"] == up["gpu7"] == up["ssd3"] == "sw3"
    assert {link.dst for link in topo.links if link.src == "sw3"} == {"cpu1", "gpu6", "gpu7", "nic2"}


def test_gpus_behind_one_switch_share_its_uplink():
    topo = from_lspci(TREE, VMM)
    same = schedule_lp(topo, [Demand("dram0", "gpu0", 1.0), Demand("dram0", "gpu1", 1.0)])
    apart = schedule_lp(topo, [Demand("dram0", "gpu0", 1.0), Demand("dram0", "gpu2", 1.0)])
    assert same.time_s == pytest.approx(2.0 / 25.0, rel=1e-6)
    assert apart.time_s == pytest.approx(1.0 / 25.0, rel=1e-6)


def test_without_vmm_classifies_by_ids_but_knows_no_sockets():
    topo = from_lspci(TREE)
    assert len(topo.of_kind(NodeKind.GPU)) == 8 and len(topo.of_kind(NodeKind.SSD)) == 4
    assert {n.socket for n in topo.nodes.values()} == {0}


def test_nvlinks_merged_from_nvidia_smi():
    topo = from_lspci(TREE, VMM, nvidia_smi=(FIX / "topo_dgx_h100.txt").read_text())
    nv = [x for x in topo.links if x.src.startswith("gpu") and x.dst.startswith("gpu")]
    assert len(nv) == 8 * 7 and all(x.gbps == 18 * 25.0 for x in nv)
    with pytest.raises(ModelFormatError, match="4 GPUs, lspci 8"):
        from_lspci(TREE, VMM, nvidia_smi=(FIX / "topo_pcie_4gpu.txt").read_text())


def test_local_vm_real_output():
    devs = parse_lspci_tree(VM_TREE)
    assert sorted(devs) == ["0000:00"] + [f"0000:00:0{i}.0" for i in range(6)]
    info = parse_lspci_vmm(VM_VMM)
    assert info["0000:00:02.0"].vendor == "1af4" and info["0000:00:03.0"].cls == "0200"
    topo = from_lspci(VM_TREE, VM_VMM)
    assert topo.of_kind(NodeKind.SSD) == ["ssd0"] and topo.of_kind(NodeKind.NIC) == ["nic0"]
    assert topo.of_kind(NodeKind.GPU) == [] and not topo.of_kind(NodeKind.SWITCH)


@pytest.mark.parametrize(
    "text,line,match",
    [
        ("hello world\n", 1, "unexpected"),
        ("-[0000:00]-+-00.0  A\n                 +-01.0  B\n", 2, "no parent"),
        ("-[0000:00]-+-00.0  A\n           +-00.0  B\n", 2, "twice"),
        ("-[0000:00]-+-00.0-[01]----[0000:02]\n", 1, "root bus"),
        ("-[0000:00]-+-00.0  A\n           |\n", 2, "no device"),
        ("", 1, "no PCI devices"),
    ],
)
def test_bad_tree_names_the_line(text, line, match):
    with pytest.raises(ModelFormatError, match=match) as err:
        parse_lspci_tree(text)
    assert err.value.context["line"] == line


def test_bad_vmm_names_the_line():
    with pytest.raises(ModelFormatError) as err:
        parse_lspci_vmm("Slot:\t0000:00:00.0\nClass Host bridge\n")
    assert err.value.context["line"] == 2
    with pytest.raises(ModelFormatError, match="before any Slot"):
        parse_lspci_vmm("Class:\tHost bridge [0600]\n")


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("-+\\|[] .:0123456789abcdefxyz\n")), max_size=200))
def test_fuzz_tree_alphabet(text):
    """Drawing characters in any order: a tree or a ModelFormatError with a line, nothing else."""
    try:
        devs = parse_lspci_tree(text)
    except ModelFormatError as exc:
        assert 1 <= exc.context["line"] <= max(1, len(text.splitlines()))
    else:
        assert devs


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_fuzz_mutated_fixture(data):
    """One line of the real drawing cut, spliced or corrupted: parse or say where."""
    lines = TREE.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    j = data.draw(st.integers(0, len(lines[i])))
    junk = data.draw(st.text(max_size=6))
    lines[i] = lines[i][:j] + junk + lines[i][j + data.draw(st.integers(0, 4)) :]
    text = "\n".join(lines)
    try:
        from_lspci(text, VMM)
    except ModelFormatError as exc:
        assert 1 <= exc.context["line"] <= len(text.splitlines()) + 1


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=120))
def test_fuzz_vmm(text):
    try:
        parse_lspci_vmm(text)
    except ModelFormatError as exc:
        assert exc.context["line"] >= 1


def test_cli_reads_lspci_file_and_detects_this_machine():
    import json
    import shutil

    from typer.testing import CliRunner

    from carina.gnn.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["topo", "--topology", str(FIX / "lspci_tv_8gpu_2socket.txt"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert sum(n["kind"] == "gpu" for n in doc["nodes"]) == 8
    if shutil.which("lspci") is None:
        pytest.skip("pciutils not installed")
    res = runner.invoke(app, ["topo", "--topology", "detect", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["name"] == "detected" and doc["simulated"] is False
    assert any(n["kind"] == "cpu" for n in doc["nodes"])
