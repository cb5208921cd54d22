"""Per-MAC iPXE boot scripts and MAC address handling.

iSCSI nodes ``sanboot`` their target (the firmware reads the boot loader from the network
disk, as M2 does). iPXE has no NBD client, so NBD nodes chain-load a kernel and initramfs
over HTTP and hand them ``root=nbd:<host>:<port>/<export>``; the initramfs attaches the disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from carina.core.errors import ConfigError
from carina.infra.provision.config import ExportKind

__all__ = ["BootTarget", "normalize_mac", "render_ipxe", "render_no_disk"]

_MAC = re.compile(r"[0-9a-f]{2}([:-]?)[0-9a-f]{2}(?:\1[0-9a-f]{2}){4}")


def normalize_mac(value: str, *, key: str = "mac") -> str:
    """Return ``value`` as ``aa:bb:cc:dd:ee:ff``; accepts ``:``/``-`` separated or bare hex.

    Raises:
        ConfigError: Not a unicast MAC-48 address.
    """
    text = value.strip().lower() if isinstance(value, str) else ""
    if not _MAC.fullmatch(text):
        raise ConfigError(f"{value!r} is not a MAC address (aa:bb:cc:dd:ee:ff)", key=key)
    digits = re.sub(r"[:-]", "", text)
    if int(digits[:2], 16) & 1:
        raise ConfigError(f"{value!r} is a multicast address, not a NIC's", key=key)
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


@dataclass(frozen=True)
class BootTarget:
    """Where a provisioned node's disk is served.

    Attributes:
        kind: NBD or iSCSI.
        host: Server address.
        port: Server port.
        name: NBD export name or iSCSI target IQN.
    """

    kind: ExportKind
    host: str
    port: int
    name: str

    @property
    def uri(self) -> str:
        """A URI QEMU and libnbd/libiscsi understand (``nbd://`` or ``iscsi://``, LUN 1)."""
        if self.kind is ExportKind.NBD:
            return f"nbd://{self.host}:{self.port}/{self.name}"
        return f"iscsi://{self.host}:{self.port}/{self.name}/1"


def render_ipxe(target: BootTarget, *, node: str, mac: str, kernel_url: str, initrd_url: str, cmdline: str = "") -> str:
    """The iPXE script that boots ``node`` from ``target``."""
    head = f"#!ipxe\n# carina: node {node} ({mac}), {target.kind.value} {target.name}\n"
    if target.kind is ExportKind.ISCSI:
        initiator = target.name.split(":", 1)[0] + ":initiator." + mac.replace(":", "")
        return (
            head
            + f"set initiator-iqn {initiator}\n"
            + f"sanboot --keep iscsi:{target.host}::{target.port}:1:{target.name} || goto failed\n"
            + ":failed\necho carina: sanboot failed\nshell\n"
        )
    args = f"root=nbd:{target.host}:{target.port}/{target.name} rw {cmdline}".strip()
    return head + f"kernel {kernel_url} {args}\ninitrd {initrd_url}\nboot\n"


def render_no_disk(node: str) -> str:
    """Script for a known node without a disk: fall through to the next boot device."""
    return f"#!ipxe\necho carina: node {node} is not provisioned\nexit 1\n"
