"""Machine topology as a capacity-constrained directed graph.

Nodes are CPUs (one per socket), their DRAM, PCIe switches, GPUs, NVSwitches
and SSDs; links carry GB/s in one direction (a cable is two links). A
topology comes from a JSON description, from ``nvidia-smi topo -m`` text, from
``lspci -tv`` (the PCIe tree, :mod:`carina.gnn.placement.lspci`), from ``/sys``
(NVMe drives and NUMA nodes), or from the built-ins below. Machines with
several GPUs cannot exist on a test host: topologies built from descriptions
carry ``simulated = True`` unless read from the machine itself::

    topo = builtin("pcie-8gpu-2socket")
    topo.links_of("gpu0")          # [Link(gpu0 -> sw0, 25.0), ...]
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core.errors import ModelFormatError

__all__ = ["BUILTINS", "Link", "Node", "NodeKind", "Topology", "builtin", "from_json", "load"]


class NodeKind(enum.Enum):
    """What a topology node is."""

    CPU = "cpu"
    DRAM = "dram"
    SWITCH = "switch"
    NVSWITCH = "nvswitch"
    GPU = "gpu"
    SSD = "ssd"
    NIC = "nic"


@dataclass(frozen=True)
class Node:
    """A device. ``capacity_gb`` is memory (GPU, DRAM) or storage (SSD) for placement."""

    name: str
    kind: NodeKind
    capacity_gb: float = 0.0
    socket: int = 0


@dataclass(frozen=True)
class Link:
    """A directed link with its bandwidth in GB/s."""

    src: str
    dst: str
    gbps: float


@dataclass
class Topology:
    """Nodes and directed links.

    Attributes:
        name: Label.
        nodes: By name.
        links: Directed links (at most one per ordered pair).
        simulated: True when this machine is a description, not the host it runs on.
    """

    name: str
    nodes: dict[str, Node] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    simulated: bool = True

    def add(self, name: str, kind: NodeKind, *, capacity_gb: float = 0.0, socket: int = 0) -> None:
        """Add a node."""
        self.nodes[name] = Node(name, kind, capacity_gb, socket)

    def connect(self, a: str, b: str, gbps: float, *, both: bool = True) -> None:
        """Add ``a -> b`` (and ``b -> a`` when ``both``) at ``gbps``."""
        self.links.append(Link(a, b, gbps))
        if both:
            self.links.append(Link(b, a, gbps))

    def of_kind(self, kind: NodeKind) -> list[str]:
        """Names of every node of ``kind``, in insertion order."""
        return [n.name for n in self.nodes.values() if n.kind is kind]

    def links_of(self, name: str) -> list[Link]:
        """Links leaving ``name``."""
        return [link for link in self.links if link.src == name]

    def validate(self, source: str = "<topology>") -> None:
        """Check every link joins known nodes with a positive bandwidth, once per direction.

        Raises:
            ModelFormatError: Naming the offending link.
        """
        seen: set[tuple[str, str]] = set()
        for i, link in enumerate(self.links):
            where = f"links[{i}]"
            for end in (link.src, link.dst):
                if end not in self.nodes:
                    raise ModelFormatError(f"link names unknown node {end!r}", file=source, key=where)
            if not link.gbps > 0:
                raise ModelFormatError(f"link {link.src}->{link.dst} needs gbps > 0", file=source, key=where)
            if link.src == link.dst or (link.src, link.dst) in seen:
                raise ModelFormatError(f"duplicate or self link {link.src}->{link.dst}", file=source, key=where)
            seen.add((link.src, link.dst))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (what :func:`from_json` reads)."""
        return {
            "name": self.name,
            "simulated": self.simulated,
            "nodes": [
                {"name": n.name, "kind": n.kind.value, "capacity_gb": n.capacity_gb, "socket": n.socket}
                for n in self.nodes.values()
            ],
            "links": [{"src": x.src, "dst": x.dst, "gbps": x.gbps} for x in self.links],
        }


def from_json(data: Any, *, source: str = "<json>") -> Topology:
    """Build a topology from its JSON description (a dict or JSON text).

    Raises:
        ModelFormatError: Malformed input, with ``key`` naming the bad entry.
    """
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"not JSON: {exc.msg}", file=source, line=exc.lineno) from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not isinstance(data.get("links"), list):
        raise ModelFormatError("a topology is an object with 'nodes' and 'links' lists", file=source)
    unknown = set(data) - {"name", "nodes", "links", "simulated"}
    if unknown:
        raise ModelFormatError(f"unknown key {sorted(unknown)[0]!r}", file=source)
    topo = Topology(name=str(data.get("name", "topology")), simulated=bool(data.get("simulated", True)))
    for i, n in enumerate(data["nodes"]):
        try:
            topo.add(
                str(n["name"]),
                NodeKind(n["kind"]),
                capacity_gb=float(n.get("capacity_gb", 0.0)),
                socket=int(n.get("socket", 0)),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ModelFormatError(f"bad node: {exc!r}", file=source, key=f"nodes[{i}]") from exc
    for i, x in enumerate(data["links"]):
        try:
            topo.links.append(Link(str(x["src"]), str(x["dst"]), float(x["gbps"])))
        except (KeyError, ValueError, TypeError) as exc:
            raise ModelFormatError(f"bad link: {exc!r}", file=source, key=f"links[{i}]") from exc
    topo.validate(source)
    return topo


def load(path: str | Path) -> Topology:
    """Read a JSON topology file."""
    p = Path(path)
    return from_json(p.read_text(), source=str(p))


# -- built-in machines (all simulated) ------------------------------------------------

PCIE4_X16 = 25.0  # GB/s, what a PCIe 4.0 x16 link delivers in practice
UPI = 40.0  # socket interconnect
DRAM_PER_SOCKET = 100.0  # GB/s a socket's memory controllers sustain
SSD_READ = 6.5  # PCIe 4.0 NVMe sequential read
NVLINK4 = 450.0  # H100 SXM, per direction through NVSwitch


def _pcie_server(name: str, *, nvswitch: bool, gpu_gb: float, ssds_per_switch: int = 2) -> Topology:
    t = Topology(name=name)
    for s in range(2):
        t.add(f"cpu{s}", NodeKind.CPU, socket=s)
        t.add(f"dram{s}", NodeKind.DRAM, capacity_gb=512.0, socket=s)
        t.connect(f"dram{s}", f"cpu{s}", DRAM_PER_SOCKET)
    t.connect("cpu0", "cpu1", UPI)
    if nvswitch:
        t.add("nvswitch", NodeKind.NVSWITCH)
    for w in range(4):
        sock = w // 2
        sw = f"sw{w}"
        t.add(sw, NodeKind.SWITCH, socket=sock)
        t.connect(sw, f"cpu{sock}", PCIE4_X16)
        for g in (2 * w, 2 * w + 1):
            t.add(f"gpu{g}", NodeKind.GPU, capacity_gb=gpu_gb, socket=sock)
            t.connect(f"gpu{g}", sw, PCIE4_X16)
            if nvswitch:
                t.connect(f"gpu{g}", "nvswitch", NVLINK4)
        for k in range(ssds_per_switch):
            ssd = f"ssd{w * ssds_per_switch + k}"
            t.add(ssd, NodeKind.SSD, capacity_gb=3840.0, socket=sock)
            t.connect(ssd, sw, SSD_READ, both=False)
    return t


def _single_gpu(name: str, *, gpu_gb: float, pcie: float, disk: float) -> Topology:
    t = Topology(name=name)
    t.add("cpu0", NodeKind.CPU)
    t.add("dram0", NodeKind.DRAM, capacity_gb=125.0)
    t.add("gpu0", NodeKind.GPU, capacity_gb=gpu_gb)
    t.add("ssd0", NodeKind.SSD, capacity_gb=1000.0)
    t.connect("dram0", "cpu0", DRAM_PER_SOCKET)
    t.connect("gpu0", "cpu0", pcie)
    t.connect("ssd0", "cpu0", disk, both=False)
    return t


BUILTINS: dict[str, str] = {
    "pcie-8gpu-2socket": "8 GPUs behind 4 PCIe 4.0 switches on 2 sockets, 2 NVMe SSDs per switch",
    "nvswitch-8gpu": "the same PCIe tree plus NVLink 4 through an NVSwitch (H100 SXM class)",
    "h100-single": "one H100 on PCIe gen5 (54.5 GB/s pinned H2D), one 1.55 GB/s virtio disk",
}


def builtin(name: str) -> Topology:
    """A built-in machine description (simulated).

    Raises:
        ModelFormatError: Unknown name (the message lists the built-ins).
    """
    if name == "pcie-8gpu-2socket":
        return _pcie_server(name, nvswitch=False, gpu_gb=40.0)
    if name == "nvswitch-8gpu":
        return _pcie_server(name, nvswitch=True, gpu_gb=80.0)
    if name == "h100-single":
        return _single_gpu(name, gpu_gb=80.0, pcie=54.5, disk=1.55)
    raise ModelFormatError(f"unknown built-in topology {name!r} (one of {', '.join(BUILTINS)})", file=name)


def names(topology: Topology, kinds: Iterable[NodeKind]) -> list[str]:
    """Node names of any of ``kinds``."""
    wanted = set(kinds)
    return [n.name for n in topology.nodes.values() if n.kind in wanted]
