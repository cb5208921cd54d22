"""Read a machine's topology: ``nvidia-smi topo -m`` text and the PCIe tree in ``/sys``.

``nvidia-smi topo -m`` gives GPU-to-GPU relations (``X`` self, ``NV#`` # NVLinks,
``PIX``/``PXB`` behind one or more PCIe switches, ``PHB`` one host bridge, ``NODE``
one NUMA node, ``SYS`` across sockets) and each GPU's NUMA node. GPUs joined by
PIX/PXB share a switch; NV# becomes a direct link of ``# x nvlink_gbps``. ``/sys``
adds NVMe drives: their NUMA node, negotiated link (GT/s x width) and root
port; devices under one root port share a switch. Link capacities not visible
from software (switch uplinks, socket interconnect) come from parameters.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from carina.core.errors import ModelFormatError
from carina.gnn.placement.topology import DRAM_PER_SOCKET, PCIE4_X16, UPI, NodeKind, Topology

__all__ = ["add_sysfs_nvme", "apply_measured", "from_nvidia_smi", "parse_nvidia_smi"]

_RELATIONS = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_GPU = re.compile(r"^GPU(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the header on a terminal


def parse_nvidia_smi(text: str, *, source: str = "nvidia-smi topo -m") -> tuple[list[list[str]], list[int]]:
    """The GPU x GPU relation matrix and each GPU's NUMA node.

    Raises:
        ModelFormatError: No header, ragged rows or an unknown relation (with the line).
    """
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    head_at = next(
        (i for i, ln in enumerate(lines) if re.search(r"\tGPU0\b", ln) or ln.strip().startswith("GPU0\t")), None
    )
    if head_at is None:
        raise ModelFormatError("no header row with GPU0 found", file=source, line=1)
    header = [c.strip() for c in lines[head_at].split("\t")]
    gpu_cols = [j for j, c in enumerate(header) if _GPU.match(c)]
    numa_col = next((j for j, c in enumerate(header) if c == "NUMA Affinity"), None)
    matrix: list[list[str]] = []
    numa: list[int] = []
    for i in range(head_at + 1, len(lines)):
        cells = [c.strip() for c in lines[i].split("\t")]
        m = _GPU.match(cells[0]) if cells else None
        if m is None:
            continue
        if int(m.group(1)) != len(matrix) or len(cells) < len(header):
            raise ModelFormatError(f"row {cells[0]} is out of order or short", file=source, line=i + 1)
        rel = [cells[j] for j in gpu_cols]
        bad = [r for r in rel if not _RELATIONS.match(r)]
        if bad:
            raise ModelFormatError(f"unknown relation {bad[0]!r}", file=source, line=i + 1)
        matrix.append(rel)
        raw = cells[numa_col] if numa_col is not None else "0"
        numa.append(int(raw) if raw.isdigit() else 0)
    if not matrix or len(matrix) != len(gpu_cols):
        raise ModelFormatError(f"{len(gpu_cols)} GPU columns but {len(matrix)} GPU rows", file=source)
    return matrix, numa


def from_nvidia_smi(
    text: str,
    *,
    gpu_gb: float = 80.0,
    pcie_gbps: float = PCIE4_X16,
    nvlink_gbps: float = 25.0,
    socket_gbps: float = UPI,
    dram_gb: float = 512.0,
    name: str = "nvidia-smi",
) -> Topology:
    """Build a topology (CPUs, DRAM, switches, GPUs, NVLinks) from ``nvidia-smi topo -m``."""
    matrix, numa = parse_nvidia_smi(text)
    n = len(matrix)
    topo = Topology(name=name, simulated=False)
    for s in sorted(set(numa)):
        topo.add(f"cpu{s}", NodeKind.CPU, socket=s)
        topo.add(f"dram{s}", NodeKind.DRAM, capacity_gb=dram_gb, socket=s)
        topo.connect(f"dram{s}", f"cpu{s}", DRAM_PER_SOCKET)
    sockets = sorted(set(numa))
    for a, b in itertools.pairwise(sockets):
        topo.connect(f"cpu{a}", f"cpu{b}", socket_gbps)
    group = list(range(n))  # union-find over PIX/PXB

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i in range(n):
        for j in range(n):
            if matrix[i][j] in ("PIX", "PXB"):
                group[root(i)] = root(j)
    switches: dict[int, str] = {}
    for i in range(n):
        topo.add(f"gpu{i}", NodeKind.GPU, capacity_gb=gpu_gb, socket=numa[i])
        members = [j for j in range(n) if root(j) == root(i)]
        if len(members) == 1:
            topo.connect(f"gpu{i}", f"cpu{numa[i]}", pcie_gbps)
            continue
        if root(i) not in switches:
            switches[root(i)] = f"sw{len(switches)}"
            topo.add(switches[root(i)], NodeKind.SWITCH, socket=numa[i])
            topo.connect(switches[root(i)], f"cpu{numa[i]}", pcie_gbps)
        topo.connect(f"gpu{i}", switches[root(i)], pcie_gbps)
    for i in range(n):
        for j in range(i + 1, n):
            if matrix[i][j].startswith("NV"):
                topo.connect(f"gpu{i}", f"gpu{j}", int(matrix[i][j][2:]) * nvlink_gbps)
    topo.validate(name)
    return topo


def _link_gbps(dev: Path) -> float:
    try:
        speed = float((dev / "current_link_speed").read_text().split()[0])
        width = int((dev / "current_link_width").read_text().strip())
    except (OSError, ValueError, IndexError):
        return PCIE4_X16 / 4
    encoding = 128 / 130 if speed >= 8 else 8 / 10
    return speed * width * encoding / 8


def add_sysfs_nvme(topo: Topology, *, sysfs: str | Path = "/sys", ssd_gb: float = 1000.0) -> list[str]:
    """Add every NVMe drive under ``sysfs`` to ``topo`` (attached to its socket's CPU).

    Returns:
        The names of the SSD nodes added.
    """
    devices = Path(sysfs) / "bus" / "pci" / "devices"
    added: list[str] = []
    for dev in sorted(devices.glob("*")) if devices.is_dir() else []:
        try:
            cls = (dev / "class").read_text().strip()
        except OSError:
            continue
        if cls != "0x010802":
            continue
        try:
            node = int((dev / "numa_node").read_text().strip())
        except (OSError, ValueError):
            node = 0
        socket = max(node, 0)
        cpu = f"cpu{socket}" if f"cpu{socket}" in topo.nodes else next(iter(topo.of_kind(NodeKind.CPU)), None)
        if cpu is None:
            topo.add("cpu0", NodeKind.CPU)
            cpu = "cpu0"
        name = f"ssd{len(topo.of_kind(NodeKind.SSD))}"
        topo.add(name, NodeKind.SSD, capacity_gb=ssd_gb, socket=socket)
        topo.connect(name, cpu, _link_gbps(dev), both=False)
        added.append(name)
    return added


def apply_measured(topo: Topology, *, pcie_gbps: float, disk_gbps: float, disk_gb: float = 1000.0) -> Topology:
    """Set every GPU's host link to the measured H2D rate and add the measured disk if none is known.

    ``pcie_gbps`` and ``disk_gbps`` come from ``carina gnn calibrate`` (pinned host->device
    copies; 1 MiB O_DIRECT reads). Returns ``topo`` (changed in place).
    """
    gpus = set(topo.of_kind(NodeKind.GPU))
    topo.links = [type(x)(x.src, x.dst, pcie_gbps) if (x.src in gpus) != (x.dst in gpus) else x for x in topo.links]
    if not topo.of_kind(NodeKind.SSD):
        cpu = topo.of_kind(NodeKind.CPU)[0]
        topo.add("ssd0", NodeKind.SSD, capacity_gb=disk_gb, socket=topo.nodes[cpu].socket)
        topo.connect("ssd0", cpu, disk_gbps, both=False)
    topo.validate(topo.name)
    return topo
