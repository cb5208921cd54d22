"""Read the PCIe tree from ``lspci -tv`` (and ``lspci -D -vmm -nn``) into a topology.

``lspci -tv`` draws the tree: ``[dddd:bb]`` root buses, ``dd.f`` devices, a bridge's
bus range ``-[ss-uu]`` followed by its children, ``+-`` / ``\\-`` branch markers and
``|`` continuations in the column of the branch that goes on. Bridges carry no name;
endpoints carry ``  Vendor Device`` (with ``[vvvv:dddd]`` under ``-nn``).
``lspci -D -vmm -nn`` adds, per full address, the class code, vendor id and (where
the kernel knows it) ``NUMANode``.

Endpoints of interest: GPUs (NVIDIA, vendor ``10de``, display class ``03xx``), SSDs
(NVMe class ``0108``; a virtio disk ``1af4:1001/1042``) and NICs (class ``02xx``).
Each root port (a bridge on a root bus) with two or more of them below it becomes a
switch whose uplink they share; a lone endpoint attaches to its socket's CPU::

    tree = parse_lspci_tree(text)              # [PciDevice(bdf="0000:bb:00.0", parent=...), ...]
    topo = from_lspci(text, vmm_text, nvidia_smi=smi_text)   # NVLinks from nvidia-smi
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from carina.core.errors import ModelFormatError
from carina.gnn.placement.topology import DRAM_PER_SOCKET, PCIE4_X16, SSD_READ, UPI, NodeKind, Topology

__all__ = ["PciDevice", "PciInfo", "from_lspci", "parse_lspci_tree", "parse_lspci_vmm"]

_BUS = re.compile(r"\[([0-9a-f]{4}):([0-9a-f]{2})\]")
_DEV = re.compile(r"([0-9a-f]{2})\.([0-7])(?:-\[([0-9a-f]{2})(?:-([0-9a-f]{2}))?\])?")
_IDS = re.compile(r"\[([0-9a-f]{4}):([0-9a-f]{4})\]\s*(?:\(rev [0-9a-f]+\))?\s*$")
NVIDIA, VIRTIO = "10de", "1af4"


@dataclass
class PciDevice:
    """One function in the tree (``bdf`` ``dddd:bb:dd.f``; root buses are ``dddd:bb``)."""

    bdf: str
    parent: str | None
    name: str = ""
    secondary: int | None = None  # first bus behind a bridge
    vendor: str = ""
    device: str = ""
    children: list[str] = field(default_factory=list)

    @property
    def is_bridge(self) -> bool:
        """True for bridges and root buses (anything with a bus behind it)."""
        return self.secondary is not None


@dataclass
class PciInfo:
    """What ``lspci -D -vmm -nn`` says about one address."""

    cls: str = ""  # four hex digits, e.g. "0302"
    vendor: str = ""
    device: str = ""
    numa: int | None = None


def _err(msg: str, source: str, line: int) -> ModelFormatError:
    return ModelFormatError(msg, file=source, line=line)


def parse_lspci_tree(text: str, *, source: str = "lspci -tv") -> dict[str, PciDevice]:
    """Every root bus and device of an ``lspci -tv`` drawing, by address.

    Raises:
        ModelFormatError: Anything that is not the drawing, naming the line.
    """
    devs: dict[str, PciDevice] = {"": PciDevice("", None)}
    owner: dict[int, str] = {}  # branch column -> the node whose children branch there
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if line.strip():
            _parse_line(line, no, source, devs, owner)
    devs.pop("")
    if not devs:
        raise _err("no PCI devices in the tree", source, 1)
    return devs


def _parse_line(line: str, no: int, source: str, devs: dict[str, PciDevice], owner: dict[int, str]) -> None:
    cur: str | None = "" if line[0] == "-" else None  # the first line hangs off the machine
    i = 0
    while i < len(line):
        ch = line[i]
        if cur is None and ch in " |":
            i += 1
        elif ch in "+\\" and line[i + 1 : i + 2] == "-":
            if cur is None:
                if i not in owner:
                    raise _err(f"branch at column {i + 1} has no parent", source, no)
                cur = owner[i]
            else:
                owner[i] = cur
            i += 2
        elif ch == "-" and cur is not None:
            i += 1
        elif cur is not None and (m := _BUS.match(line, i)):
            cur = _add(devs, f"{m.group(1)}:{m.group(2)}", cur, secondary=int(m.group(2), 16), no=no, src=source)
            i = m.end()
        elif cur is not None and (m := _DEV.match(line, i)) and devs[cur].secondary is not None:
            bdf = f"{_domain(devs, cur)}:{devs[cur].secondary:02x}:{m.group(1)}.{m.group(2)}"
            sec = int(m.group(3), 16) if m.group(3) else None
            cur = _add(devs, bdf, cur, secondary=sec, no=no, src=source)
            i = m.end()
            if line.startswith("  ", i) and sec is None:
                _name(devs[cur], line[i:].strip())
                return
        else:
            raise _err(f"unexpected {line[i : i + 12]!r} at column {i + 1}", source, no)
    if cur is None:
        raise _err("a line with no device", source, no)


def _domain(devs: dict[str, PciDevice], node: str) -> str:
    while devs[node].parent:  # walk up to the root bus "dddd:bb"
        node = devs[node].parent or ""
    if not node:
        return "0000"
    return node.split(":")[0]


def _add(devs: dict[str, PciDevice], bdf: str, parent: str, *, secondary: int | None, no: int, src: str) -> str:
    if bdf in devs:
        raise _err(f"{bdf} appears twice", src, no)
    if bdf.count(":") == 1 and parent != "":
        raise _err(f"root bus {bdf} below a device", src, no)
    devs[bdf] = PciDevice(bdf, parent or None, secondary=secondary)
    devs[parent].children.append(bdf)
    return bdf


def _name(dev: PciDevice, name: str) -> None:
    dev.name = name
    m = _IDS.search(name)
    if m:
        dev.vendor, dev.device = m.group(1), m.group(2)


def parse_lspci_vmm(text: str, *, source: str = "lspci -D -vmm -nn") -> dict[str, PciInfo]:
    """Class, vendor, device ids and NUMA node per address from ``lspci -D -vmm -nn``.

    Raises:
        ModelFormatError: A record without ``Slot`` or a line that is not ``Key:<TAB>value``.
    """
    out: dict[str, PciInfo] = {}
    slot: str | None = None
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            slot = None
            continue
        key, sep, value = line.partition(":\t")
        if not sep or not key.isalnum():
            raise _err(f"not a 'Key:<TAB>value' line: {line[:40]!r}", source, no)
        if key == "Slot":
            slot = value.strip()
            out[slot] = PciInfo()
            continue
        if slot is None:
            raise _err(f"{key} before any Slot", source, no)
        ids = re.search(r"\[([0-9a-f]{4})\]\s*$", value)
        if key == "Class" and ids:
            out[slot].cls = ids.group(1)
        elif key == "Vendor" and ids:
            out[slot].vendor = ids.group(1)
        elif key == "Device" and ids:
            out[slot].device = ids.group(1)
        elif key == "NUMANode":
            out[slot].numa = int(value) if value.strip().isdigit() else None
    return out


def classify(dev: PciDevice, info: PciInfo | None) -> NodeKind | None:
    """GPU, SSD, NIC or ``None`` (not of interest) for one endpoint."""
    vendor = (info.vendor if info else "") or dev.vendor
    cls = info.cls if info else ""
    name = dev.name.lower()
    if cls:
        if cls.startswith("03") and vendor == NVIDIA:
            return NodeKind.GPU
        if cls == "0108" or (vendor == VIRTIO and cls.startswith("01")):
            return NodeKind.SSD
        return NodeKind.NIC if cls.startswith("02") else None
    if vendor == NVIDIA or "nvidia" in name:
        return None if any(w in name for w in ("bridge", "nvswitch", "audio", "usb")) else NodeKind.GPU
    if "nvme" in name or "non-volatile" in name or (vendor == VIRTIO and dev.device in ("1001", "1042")):
        return NodeKind.SSD
    if any(w in name for w in ("ethernet", "connectx", "network controller", "network device", "infiniband")):
        return NodeKind.NIC
    return None


def _root_port(devs: dict[str, PciDevice], bdf: str) -> tuple[str, str | None]:
    """The root bus above ``bdf`` and the root port (bridge on that bus) it hangs under."""
    node, below = bdf, None
    while devs[node].parent is not None:
        node, below = devs[node].parent or "", node
    return node, (below if below is not None and below != bdf else None)


def _sockets(devs: dict[str, PciDevice], info: dict[str, PciInfo]) -> dict[str, int]:
    """Socket (NUMA node) of each root bus: the first NUMA node any device below it reports."""
    out: dict[str, int] = {}
    for bdf in sorted(devs):
        numa = info[bdf].numa if bdf in info else None
        if numa is not None:
            out.setdefault(_root_port(devs, bdf)[0], numa)
    return {b: out.get(b, 0) for b in devs if devs[b].parent is None}


def from_lspci(
    tree_text: str,
    vmm_text: str | None = None,
    *,
    nvidia_smi: str | None = None,
    gpu_gb: float = 80.0,
    gpu_gbps: float = PCIE4_X16,
    uplink_gbps: float = PCIE4_X16,
    ssd_gbps: float = SSD_READ,
    nic_gbps: float = PCIE4_X16,
    socket_gbps: float = UPI,
    dram_gb: float = 512.0,
    ssd_gb: float = 3840.0,
    name: str = "lspci",
) -> Topology:
    """Build a topology from the PCIe tree; NVLinks from ``nvidia-smi topo -m`` text if given.

    GPUs are numbered in address order (the order ``nvidia-smi`` uses), SSDs and NICs too.
    Link rates not visible in ``lspci`` come from the parameters.

    Raises:
        ModelFormatError: Either text is malformed, or ``nvidia-smi`` counts other GPUs.
    """
    devs = parse_lspci_tree(tree_text)
    info = parse_lspci_vmm(vmm_text) if vmm_text else {}
    socket_of = _sockets(devs, info)
    topo = Topology(name=name, simulated=False)
    sockets = sorted(set(socket_of.values()))
    for s in sockets:
        topo.add(f"cpu{s}", NodeKind.CPU, socket=s)
        topo.add(f"dram{s}", NodeKind.DRAM, capacity_gb=dram_gb, socket=s)
        topo.connect(f"dram{s}", f"cpu{s}", DRAM_PER_SOCKET)
    for a, b in itertools.pairwise(sockets):
        topo.connect(f"cpu{a}", f"cpu{b}", socket_gbps)
    found = [(bdf, classify(d, info.get(bdf))) for bdf, d in sorted(devs.items()) if not d.is_bridge]
    ends = [(bdf, kind) for bdf, kind in found if kind is not None]
    by_port: dict[str | None, list[str]] = {}
    for bdf, _ in ends:
        by_port.setdefault(_root_port(devs, bdf)[1] or bdf, []).append(bdf)
    rate = {NodeKind.GPU: gpu_gbps, NodeKind.SSD: ssd_gbps, NodeKind.NIC: nic_gbps}
    cap = {NodeKind.GPU: gpu_gb, NodeKind.SSD: ssd_gb, NodeKind.NIC: 0.0}
    switch_of: dict[str, str] = {}
    for port, members in by_port.items():
        if len(members) > 1 and port is not None:
            sw = f"sw{len(set(switch_of.values()))}"
            sock = socket_of[_root_port(devs, members[0])[0]]
            topo.add(sw, NodeKind.SWITCH, socket=sock)
            topo.connect(sw, f"cpu{sock}", uplink_gbps)
            switch_of.update({m: sw for m in members})
    for bdf, kind in ends:
        assert kind is not None
        sock = socket_of[_root_port(devs, bdf)[0]]
        node = f"{kind.value}{len(topo.of_kind(kind))}"
        topo.add(node, kind, capacity_gb=cap[kind], socket=sock)
        topo.connect(node, switch_of.get(bdf, f"cpu{sock}"), rate[kind], both=kind is not NodeKind.SSD)
    if nvidia_smi is not None:
        _add_nvlinks(topo, nvidia_smi)
    topo.validate(name)
    return topo


def _add_nvlinks(topo: Topology, text: str, nvlink_gbps: float = 25.0) -> None:
    from carina.gnn.placement.discover import parse_nvidia_smi

    matrix, _ = parse_nvidia_smi(text)
    gpus = topo.of_kind(NodeKind.GPU)
    if len(matrix) != len(gpus):
        raise ModelFormatError(f"nvidia-smi shows {len(matrix)} GPUs, lspci {len(gpus)}", file="nvidia-smi topo -m")
    for i, j in itertools.combinations(range(len(gpus)), 2):
        if matrix[i][j].startswith("NV"):
            topo.connect(gpus[i], gpus[j], int(matrix[i][j][2:]) * nvlink_gbps)
