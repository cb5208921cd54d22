"""End to end: real QEMU guests (TCG) boot from their network disks and say so on the serial console."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.infra.provision.config import ExportKind
from carina.infra.provision.service import Provisioner
from carina.testing.provision import READY_MARKER, GuestKernel, parse_ready_line

pytestmark = pytest.mark.slow


def boot(prov: Provisioner, node: str) -> dict[str, str]:
    handle = prov.power_on("lab", node)
    driver, _ = prov.node_power("lab", node)
    driver.wait_console(handle, READY_MARKER, timeout=90)
    driver.wait_off(handle, timeout=30)  # the guest powers itself off after the marker
    console = driver.console(handle)
    ready = parse_ready_line(console)
    assert ready is not None, console[-500:]
    return ready


def add_guest_node(prov: Provisioner, name: str, mac: str, guest: tuple[GuestKernel, Path]) -> None:
    kernel, initrd = guest
    prov.add_node("lab", name, mac, power="qemu", params={"kernel": str(kernel.vmlinuz), "initrd": str(initrd)})


def test_nbd_boot_writes_persist_through_snapshot(
    prov: Provisioner, golden: Path, guest: tuple[GuestKernel, Path]
) -> None:
    prov.import_image("lab", "gold", golden)
    add_guest_node(prov, "n1", "52:54:00:12:34:01", guest)
    prov.provision("lab", "n1", "gold", ExportKind.NBD)
    assert boot(prov, "n1") == {"image": "golden-1", "boots": "0"}
    assert boot(prov, "n1")["boots"] == "1"  # the first boot's write is in the clone
    prov.snapshot("lab", "n1", "gold-after")
    prov.release("lab", "n1")
    prov.provision("lab", "n1", "gold-after", ExportKind.NBD)
    assert boot(prov, "n1") == {"image": "golden-1", "boots": "2"}  # carried by the snapshot
    prov.release("lab", "n1")
    prov.provision("lab", "n1", "gold", ExportKind.NBD)
    assert boot(prov, "n1")["boots"] == "0"  # the golden image never changed


def test_iscsi_boot(prov: Provisioner, golden: Path, guest: tuple[GuestKernel, Path]) -> None:
    prov.import_image("lab", "gold", golden)
    add_guest_node(prov, "n2", "52:54:00:12:34:02", guest)
    placement = prov.provision("lab", "n2", "gold", ExportKind.ISCSI)
    assert placement.uri.startswith("iscsi://")
    assert boot(prov, "n2") == {"image": "golden-1", "boots": "0"}
    prov.release("lab", "n2")
    assert prov.exports.tgt.targets() == {}
