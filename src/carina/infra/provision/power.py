"""Power drivers: how a node is switched on and where its console goes.

:class:`QemuPower` starts a local QEMU guest (TCG) as the node, with the node's MAC on
its NIC and its network disk attached from the export URI; the serial console is
logged to a file. :class:`IpmiPower` drives a real machine's BMC with ``ipmitool``
(the password travels in the environment, never on a command line or in logs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from carina.core.backend import Backend
from carina.core.errors import BackendUnavailable, ConfigError, ProvisioningError
from carina.infra.provision.daemon import Daemon

__all__ = ["POWER_DRIVERS", "IpmiPower", "NodeHandle", "PowerDriver", "QemuPower", "power_driver"]


@dataclass(frozen=True)
class NodeHandle:
    """What a power driver needs to know about one node."""

    key: str  # "<project>-<node>", safe in file names
    mac: str
    disk_uri: str | None
    run_dir: Path
    params: dict[str, Any]

    @property
    def console_path(self) -> Path:
        """Serial console log of the node."""
        return self.run_dir / "consoles" / f"{self.key}.log"


class PowerDriver(Backend):
    """Switch nodes on and off; read their console."""

    PARAMS: ClassVar[frozenset[str]] = frozenset()

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Reject unknown parameters (ConfigError naming the key)."""
        for key in params:
            if key not in self.PARAMS:
                raise ConfigError(f"unknown {self.name} power parameter {key!r}", key=f"power.{key}")
        return params

    def on(self, node: NodeHandle) -> None:
        """Power the node on (booting from the network)."""
        reasons = self.unsupported_reasons()
        if reasons:
            raise BackendUnavailable("; ".join(reasons), driver=self.name)
        self._on(node)

    def _on(self, node: NodeHandle) -> None:
        raise NotImplementedError

    def off(self, node: NodeHandle) -> None:
        """Power the node off (no-op if it is off)."""

    def is_on(self, node: NodeHandle) -> bool:
        """Whether the node is powered."""
        return False

    def console(self, node: NodeHandle) -> str:
        """Everything the node printed on its serial console so far."""
        try:
            return node.console_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_console(self, node: NodeHandle, marker: str, timeout: float = 120.0) -> str:
        """Wait until ``marker`` appears on the console; return the console text.

        Raises:
            ProvisioningError: Timeout, or the node powered off without printing it.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.console(node)
            if marker in text:
                return text
            if not self.is_on(node) and marker not in (text := self.console(node)):
                raise ProvisioningError(f"node powered off before {marker!r}: {text[-400:]}", node=node.key)
            time.sleep(0.05)
        raise ProvisioningError(f"no {marker!r} on the console in {timeout:.0f} s", node=node.key)

    def wait_off(self, node: NodeHandle, timeout: float = 30.0) -> None:
        """Wait until the node has powered itself off.

        Raises:
            ProvisioningError: It is still on after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while self.is_on(node):
            if time.monotonic() > deadline:
                raise ProvisioningError(f"node still on after {timeout:.0f} s", node=node.key)
            time.sleep(0.05)


class QemuPower(PowerDriver):
    """A local QEMU guest as the node (TCG, so it runs anywhere)."""

    name: ClassVar[str] = "qemu"
    PARAMS: ClassVar[frozenset[str]] = frozenset({"kernel", "initrd", "append", "memory_mib", "ipxe_url"})

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Needs qemu-system-x86_64."""
        return [] if shutil.which("qemu-system-x86_64") else ["apt-get install qemu-system-x86"]

    def argv(self, node: NodeHandle) -> list[str]:
        """The QEMU command line for ``node``.

        With ``ipxe_url`` the NIC's iPXE ROM boots from the network: DHCP hands it that
        URL (the node's ``/boot/<mac>.ipxe``; the host is 10.0.2.2 from inside). With
        ``kernel`` QEMU loads the kernel itself. Either way the export is attached as the
        node's virtio disk (the test initramfs has no NBD/iSCSI initiator of its own).
        """
        p = node.params
        argv = [
            "qemu-system-x86_64", "-accel", "tcg", "-m", str(p.get("memory_mib", 256)),
            "-nodefaults", "-display", "none", "-no-reboot",
            "-serial", f"file:{node.console_path}",
        ]  # fmt: skip
        if p.get("ipxe_url"):
            argv += ["-netdev", f"user,id=net0,bootfile={p['ipxe_url']}", "-boot", "n"]
            argv += ["-device", f"virtio-net-pci,netdev=net0,mac={node.mac}"]
        else:
            argv += ["-netdev", "user,id=net0,restrict=on"]
            argv += ["-device", f"virtio-net-pci,netdev=net0,mac={node.mac},romfile="]
        if p.get("kernel") and not p.get("ipxe_url"):
            append = p.get("append", "console=ttyS0 quiet panic=-1")
            argv += ["-kernel", str(p["kernel"]), "-append", append]
            if p.get("initrd"):
                argv += ["-initrd", str(p["initrd"])]
        if node.disk_uri:
            argv += ["-drive", f"file={node.disk_uri},format=raw,if=virtio,cache=none"]
        return argv

    def _daemon(self, node: NodeHandle) -> Daemon:
        return Daemon(f"node-{node.key}", node.run_dir / "nodes")

    def _on(self, node: NodeHandle) -> None:
        if self.is_on(node):
            return
        node.console_path.parent.mkdir(parents=True, exist_ok=True)
        node.console_path.write_text("")
        self._daemon(node).start(self.argv(node), ready=lambda: True)

    def off(self, node: NodeHandle) -> None:
        """Kill the guest (a hard power-off)."""
        self._daemon(node).stop()

    def is_on(self, node: NodeHandle) -> bool:
        """Whether the guest process is alive."""
        return self._daemon(node).pid() is not None


class IpmiPower(PowerDriver):
    """A real machine's BMC over IPMI-over-LAN (``ipmitool -I lanplus``)."""

    name: ClassVar[str] = "ipmi"
    PARAMS: ClassVar[frozenset[str]] = frozenset({"host", "user", "password"})

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Needs ipmitool."""
        return [] if shutil.which("ipmitool") else ["apt-get install ipmitool"]

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Host and user are required."""
        super().check_params(params)
        for key in ("host", "user"):
            if not params.get(key):
                raise ConfigError(f"ipmi power needs {key!r}", key=f"power.{key}")
        return params

    def _ipmitool(self, node: NodeHandle, *args: str) -> str:
        p = node.params
        env = {**os.environ, "IPMI_PASSWORD": str(p.get("password", ""))}
        argv = ["ipmitool", "-I", "lanplus", "-H", str(p["host"]), "-U", str(p["user"]), "-E", *args]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        if done.returncode != 0:
            raise ProvisioningError(f"ipmitool {' '.join(args)} failed: {done.stderr.strip()}", bmc=p["host"])
        return done.stdout

    def _on(self, node: NodeHandle) -> None:
        self._ipmitool(node, "chassis", "bootdev", "pxe")
        self._ipmitool(node, "chassis", "power", "on")

    def off(self, node: NodeHandle) -> None:
        """Hard power-off through the BMC."""
        self._ipmitool(node, "chassis", "power", "off")

    def is_on(self, node: NodeHandle) -> bool:
        """Ask the BMC."""
        return "is on" in self._ipmitool(node, "chassis", "power", "status")


POWER_DRIVERS: dict[str, type[PowerDriver]] = {"qemu": QemuPower, "ipmi": IpmiPower}


def power_driver(name: str) -> PowerDriver:
    """The power driver called ``name``."""
    try:
        return POWER_DRIVERS[name]()
    except KeyError:
        raise ConfigError(f"unknown power driver {name!r} (known: {', '.join(POWER_DRIVERS)})", key="power") from None
