from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from carina.core.errors import ConfigError, ProvisioningError
from carina.infra.provision.errors import Conflict, NotFound
from carina.infra.provision.service import Provisioner


def image_files(prov: Provisioner) -> list[str]:
    root = prov.config.path("images")
    return sorted(p.name for p in root.rglob("*")) if root.exists() else []


def test_import_raw_and_qcow2_with_checksums(prov: Provisioner, golden: Path, tmp_path: Path) -> None:
    raw = prov.import_image("lab", "gold", golden)
    assert raw["sha256"] == hashlib.sha256(golden.read_bytes()).hexdigest()
    q = tmp_path / "g.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(golden), str(q)], check=True)
    qrow = prov.import_image("lab", "gold-q", q, sha256=hashlib.sha256(q.read_bytes()).hexdigest())
    assert qrow["format"] == "qcow2" and qrow["virtual_size"] == golden.stat().st_size
    assert [i["name"] for i in prov.list_images("lab")] == ["gold", "gold-q"]
    assert prov.list_images("other") == []
    with pytest.raises(Conflict):
        prov.import_image("lab", "gold", golden)


def test_bad_input_writes_no_image(prov: Provisioner, golden: Path, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.qcow2"
    q = tmp_path / "g.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(golden), str(q)], check=True)
    data = bytearray(q.read_bytes())
    data[0x30:0x38] = (1 << 40).to_bytes(8, "big")  # l1_table_offset far beyond the file
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ProvisioningError):
        prov.import_image("lab", "bad", corrupt)
    with pytest.raises(ProvisioningError, match="checksum mismatch"):
        prov.import_image("lab", "bad", golden, sha256="a" * 64)
    with pytest.raises(ProvisioningError, match="not found"):
        prov.import_image("lab", "bad", tmp_path / "missing.raw")
    with pytest.raises(ConfigError):
        prov.import_image("lab", "Bad_Name", golden)
    with pytest.raises(NotFound):
        prov.import_image("nobody", "bad", golden)
    assert image_files(prov) == [] or image_files(prov) == ["lab"]
    assert prov.list_images("lab") == []


def test_delete_refused_while_clones_exist(prov: Provisioner, golden: Path) -> None:
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    prov.provision("lab", "n1", "gold")
    with pytest.raises(Conflict, match="n1"):
        prov.delete_image("lab", "gold")
    prov.release("lab", "n1")
    prov.delete_image("lab", "gold")
    assert prov.list_images("lab") == [] and image_files(prov) == ["lab"]
    with pytest.raises(NotFound):
        prov.delete_image("lab", "gold")
