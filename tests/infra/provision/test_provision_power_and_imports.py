from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from carina.core.errors import ConfigError
from carina.infra.provision.power import IpmiPower, NodeHandle, QemuPower, power_driver


def test_cli_import_is_light() -> None:
    code = (
        "import sys, carina.infra.provision.cli, carina.infra.provision;"
        "bad = [m for m in ('fastapi', 'sqlalchemy', 'qemu.qmp', 'torch', 'uvicorn') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_qemu_node_command_line(tmp_path: Path) -> None:
    node = NodeHandle(
        "lab-n1", "52:54:00:00:00:01", "nbd://127.0.0.1:1/lab-n1", tmp_path, {"kernel": "k", "initrd": "i"}
    )
    argv = QemuPower().argv(node)
    assert "virtio-net-pci,netdev=net0,mac=52:54:00:00:00:01,romfile=" in argv
    assert "file=nbd://127.0.0.1:1/lab-n1,format=raw,if=virtio,cache=none" in argv
    assert argv[argv.index("-kernel") + 1] == "k" and argv[argv.index("-initrd") + 1] == "i"
    assert f"file:{tmp_path / 'consoles' / 'lab-n1.log'}" in argv


def test_ipmi_params_and_secret_handling() -> None:
    drv = power_driver("ipmi")
    assert isinstance(drv, IpmiPower)
    with pytest.raises(ConfigError, match="host"):
        drv.check_params({"user": "admin"})
    with pytest.raises(ConfigError, match=r"power\.port"):
        drv.check_params({"host": "bmc", "user": "admin", "port": 623})
    assert drv.check_params({"host": "bmc", "user": "admin", "password": "s3cret"})["host"] == "bmc"
    with pytest.raises(ConfigError, match="unknown power driver"):
        power_driver("wol")
