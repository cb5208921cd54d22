"""The VM's own topology, as GPUDirect RDMA and NCCL need it (Vela runs GPUs inside KVM guests).

Reads sysfs and procfs (a root can be given, for tests): GPUs and NICs with their
NUMA node and PCIe upstream path, whether each GPU shares a PCIe switch with a
NIC, IOMMU groups, ACS capability, huge pages, and the hypervisor seen from inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carina.infra.cluster.checks.base import Check, CheckContext, CheckResult, Status

__all__ = ["PciDevice", "VmTopology", "read_pci", "read_topology"]

NVIDIA = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")
_NIC_CLASSES = ("0x0200", "0x0207")  # Ethernet, InfiniBand


@dataclass(frozen=True)
class PciDevice:
    """A PCI function: address, kind, NUMA node and the bridges above it."""

    address: str
    kind: str  # gpu | nic
    vendor: str
    numa_node: int
    upstream: tuple[str, ...]  # bridge addresses from the root down
    iommu_group: str | None

    def switch(self) -> str | None:
        """The lowest bridge above the device that is not the root port (its PCIe switch), if any."""
        return self.upstream[-2] if len(self.upstream) >= 2 else None


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def read_pci(root: Path = Path("/")) -> list[PciDevice]:
    """GPUs and NICs found under ``root``/sys/bus/pci/devices."""
    devices = []
    base = root / "sys/bus/pci/devices"
    for link in sorted(base.glob("*")) if base.exists() else []:
        cls = _read(link / "class")
        kind = "gpu" if cls.startswith(_GPU_CLASSES) else "nic" if cls.startswith(_NIC_CLASSES) else None
        if kind is None:
            continue
        vendor = _read(link / "vendor")
        if kind == "gpu" and vendor != NVIDIA:
            continue
        real = link.resolve()
        parts = [p for p in real.parts if _looks_like_bdf(p)]
        group = link / "iommu_group"
        devices.append(
            PciDevice(
                link.name,
                kind,
                vendor,
                int(_read(link / "numa_node", "-1") or -1),
                tuple(parts[:-1]),
                group.resolve().name if group.exists() else None,
            )
        )
    return devices


def _looks_like_bdf(part: str) -> bool:
    return len(part) == 12 and part[4] == ":" and part[7] == ":" and part[10] == "."


def read_topology(root: Path = Path("/")) -> dict[str, Any]:
    """Everything the check reports, as plain data."""
    devices = read_pci(root)
    gpus = [d for d in devices if d.kind == "gpu"]
    nics = [d for d in devices if d.kind == "nic"]
    pairs = {}
    for gpu in gpus:
        same_switch = [n.address for n in nics if gpu.switch() and n.switch() == gpu.switch()]
        same_numa = [n.address for n in nics if n.numa_node == gpu.numa_node]
        pairs[gpu.address] = {
            "numa_node": gpu.numa_node,
            "switch": gpu.switch(),
            "nics_same_switch": same_switch,
            "nics_same_numa": same_numa,
        }
    meminfo = _read(root / "proc/meminfo")
    huge = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("HugePages_Total")), 0)
    cpuinfo = _read(root / "proc/cpuinfo")
    return {
        "gpus": pairs,
        "nics": [n.address for n in nics],
        "iommu_groups": len(list((root / "sys/kernel/iommu_groups").glob("*"))),
        "hugepages_total": huge,
        "thp": _read(root / "sys/kernel/mm/transparent_hugepage/enabled", "unknown"),
        "hypervisor": "hypervisor" in cpuinfo.split(),
        "dmi": {k: _read(root / f"sys/class/dmi/id/{k}", "unknown") for k in ("sys_vendor", "product_name")},
    }


class VmTopology(Check):
    """GPUs and NICs laid out as GPUDirect RDMA needs; IOMMU, huge pages and hypervisor reported."""

    name = "vm_topology"
    rationale = "a GPU without a NIC on its PCIe switch or NUMA node forces RDMA through the CPU root complex"
    exclusive = False

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root

    def _run(self, ctx: CheckContext) -> CheckResult:
        topo = read_topology(self.root)
        metrics: dict[str, float] = {
            "gpus": len(topo["gpus"]),
            "nics": len(topo["nics"]),
            "iommu_groups": topo["iommu_groups"],
            "hugepages_total": topo["hugepages_total"],
            "in_vm": int(topo["hypervisor"]),
        }
        notes = []
        if topo["nics"]:
            for gpu, info in topo["gpus"].items():
                if not info["nics_same_switch"] and not info["nics_same_numa"]:
                    notes.append(f"GPU {gpu} shares neither a PCIe switch nor a NUMA node with a NIC")
        p2p = _peer_access(ctx)
        if p2p is not None:
            metrics["p2p_pairs_missing"] = p2p
            if p2p:
                notes.append(f"{p2p} GPU pairs lack peer-to-peer access")
        status = Status.WARN if notes else Status.PASS
        where = "a VM" if topo["hypervisor"] else "bare metal"
        return CheckResult(
            self.name, status, "; ".join(notes) or f"{metrics['gpus']} GPUs, {metrics['nics']} NICs, {where}", metrics
        )


def _peer_access(ctx: CheckContext) -> int | None:
    """Number of GPU pairs without peer access (None without two CUDA GPUs)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    n = torch.cuda.device_count()
    return sum(1 for i in range(n) for j in range(n) if i != j and not torch.cuda.can_device_access_peer(i, j))
