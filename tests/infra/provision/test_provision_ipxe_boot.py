"""End to end through real iPXE firmware: DHCP -> per-MAC script from the carina API -> kernel -> READY."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import Request, Response

from carina.infra.provision.api import create_app
from carina.infra.provision.config import ExportKind, ProvisionConfig
from carina.infra.provision.power import QemuPower
from carina.infra.provision.service import Provisioner
from carina.testing.provision import READY_MARKER, GuestKernel, parse_ready_line

pytestmark = pytest.mark.slow
ROM = Path("/usr/lib/ipxe/qemu/pxe-virtio.rom")


@pytest.fixture
def served(config: ProvisionConfig) -> Iterator[tuple[Provisioner, list[str]]]:
    if not ROM.exists() and not Path("/usr/share/qemu/efi-virtio.rom").exists():
        pytest.skip("no iPXE ROM: apt-get install ipxe-qemu")
    config.advertise_host = "10.0.2.2"  # the host, as a QEMU user-network guest sees it
    config.kernel_cmdline = "console=ttyS0 quiet panic=-1"
    prov = Provisioner(config)
    prov.create_project("lab", token="lab-token")
    app = create_app(prov)
    seen: list[str] = []

    @app.middleware("http")
    async def record(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        seen.append(request.url.path)
        return await call_next(request)

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.http_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield prov, seen
    finally:
        server.should_exit = True
        thread.join(10)
        prov.close(stop_daemons=True)


def test_ipxe_fetches_its_script_and_boots(
    served: tuple[Provisioner, list[str]], golden: Path, guest: tuple[GuestKernel, Path]
) -> None:
    prov, seen = served
    kernel, initrd = guest
    files = prov.config.path("boot-files")
    files.mkdir(parents=True)
    shutil.copyfile(kernel.vmlinuz, files / "vmlinuz")
    shutil.copyfile(initrd, files / "initrd.gz")
    mac = "52:54:00:12:34:77"
    url = f"http://10.0.2.2:{prov.config.http_port}/boot/{mac}.ipxe"
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "px", mac, power="qemu", params={"ipxe_url": url})
    placement = prov.provision("lab", "px", "gold", ExportKind.NBD)
    assert f"root=nbd:10.0.2.2:{prov.config.nbd_port}/lab.px" in placement.boot_script
    handle = prov.power_on("lab", "px")
    driver = QemuPower()
    driver.wait_console(handle, READY_MARKER, timeout=150)
    driver.wait_off(handle)
    assert parse_ready_line(driver.console(handle)) == {"image": "golden-1", "boots": "0"}
    assert seen[:3] == [f"/boot/{mac}.ipxe", "/boot/files/vmlinuz", "/boot/files/initrd.gz"]
