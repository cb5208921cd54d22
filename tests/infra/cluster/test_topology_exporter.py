import urllib.request
from pathlib import Path

import pytest

from carina.infra.cluster.checks import CheckContext, CheckResult, Status
from carina.infra.cluster.checks.topology import VmTopology, read_topology
from carina.infra.cluster.exporter import Exporter, render_metrics
from carina.infra.cluster.runner import NodeLabel, NodeReport


def _device(root: Path, chain: list[str], cls: str, vendor: str, numa: int) -> None:
    real = root / "sys/devices/pci0000:00" / "/".join(chain)
    real.mkdir(parents=True)
    (real / "class").write_text(cls + "\n")
    (real / "vendor").write_text(vendor + "\n")
    (real / "numa_node").write_text(f"{numa}\n")
    link = root / "sys/bus/pci/devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(real)


@pytest.fixture
def sysfs(tmp_path):
    # Socket 0: root port 00:01.0 -> switch 01:00.0 -> GPU 02:00.0 and NIC 03:00.0 (GPUDirect-friendly).
    _device(tmp_path, ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"], "0x030200", "0x10de", 0)
    _device(tmp_path, ["0000:00:01.0", "0000:01:00.0", "0000:03:00.0"], "0x020000", "0x15b3", 0)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1 kB\nHugePages_Total:    1024\n")
    (tmp_path / "proc/cpuinfo").write_text("flags\t: fpu sse hypervisor\n")
    return tmp_path


def test_gpu_and_nic_on_one_switch_pass(sysfs):
    topo = read_topology(sysfs)
    assert topo["gpus"]["0000:02:00.0"]["nics_same_switch"] == ["0000:03:00.0"]
    assert topo["hypervisor"] is True and topo["hugepages_total"] == 1024
    assert VmTopology(sysfs).run(CheckContext(device="cpu")).status is Status.PASS


def test_gpu_far_from_every_nic_warns(sysfs):
    _device(sysfs, ["0000:80:01.0", "0000:81:00.0", "0000:82:00.0"], "0x030200", "0x10de", 1)
    result = VmTopology(sysfs).run(CheckContext(device="cpu"))
    assert result.status is Status.WARN and "0000:82:00.0" in result.message


def _report(label=NodeLabel.WARN):
    return NodeReport(
        "node-a", label, [CheckResult("ecc", Status.WARN, "GPU 1: 5 corrected", {"gpu1_ecc_corrected": 5})], 0.1
    )


def test_exporter_text_and_http():
    text = render_metrics(_report()).decode()
    assert 'carina_node_health{label="WARN",node="node-a"} 1.0' in text
    assert 'carina_node_health{label="EVICT",node="node-a"} 0.0' in text
    assert 'carina_check_metric{check="ecc",metric="gpu1_ecc_corrected",node="node-a"} 5.0' in text
    exporter = Exporter(_report, interval_s=3600)
    port = exporter.serve("127.0.0.1", 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        exporter.close()
    assert 'carina_check_status{check="ecc",node="node-a",status="WARN"} 1.0' in body
