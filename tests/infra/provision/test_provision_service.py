from __future__ import annotations

import hashlib
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from carina.core.errors import ConfigError, ProvisioningError
from carina.infra.provision.config import ExportKind, IscsiBacking, NodeState
from carina.infra.provision.errors import Conflict, NotFound
from carina.infra.provision.service import Provisioner


def read_export(uri: str, dest: Path) -> str:
    """Copy a network disk to a file with qemu-img and return its SHA-256."""
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "raw", uri, str(dest)], check=True, timeout=60)
    return hashlib.sha256(dest.read_bytes()).hexdigest()


def write_export(uri: str, offset: int, data: bytes, tmp: Path) -> None:
    src = tmp / "patch.bin"
    src.write_bytes(data)
    # qemu-io writes through the NBD export, exactly as a booted node would.
    subprocess.run(
        ["qemu-io", "-f", "raw", "-c", f"write -P 0xab {offset} {len(data)}", uri], check=True, capture_output=True
    )


def live(prov: Provisioner) -> tuple[set[str], set[str]]:
    exports = set(prov.exports.qsd.exports()) if prov.exports.qsd.daemon.pid() else set()
    clones = {p.name for p in prov.config.path("clones").rglob("*.qcow2")}
    return exports, clones


def test_nbd_export_serves_the_golden_bytes(prov: Provisioner, golden: Path, tmp_path: Path) -> None:
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    placement = prov.provision("lab", "n1", "gold", ExportKind.NBD)
    assert placement.uri == f"nbd://127.0.0.1:{prov.config.nbd_port}/lab.n1"
    assert read_export(placement.uri, tmp_path / "a.raw") == hashlib.sha256(golden.read_bytes()).hexdigest()
    # The clone is copy-on-write: tiny, and backed by the image.
    assert Path(placement.disk).stat().st_size < 1 << 20
    # Idempotent: same request, same answer, no second export.
    assert prov.provision("lab", "n1", "gold", ExportKind.NBD) == placement
    assert len(prov.exports.qsd.exports()) == 1
    with pytest.raises(Conflict):
        prov.provision("lab", "n1", "gold", ExportKind.ISCSI)
    prov.release("lab", "n1")
    assert live(prov) == (set(), set())


def test_iscsi_export_serves_the_golden_bytes(prov: Provisioner, golden: Path, tmp_path: Path) -> None:
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    placement = prov.provision("lab", "n1", "gold", ExportKind.ISCSI)
    assert placement.uri.startswith("iscsi://127.0.0.1:")
    assert read_export(placement.uri, tmp_path / "a.raw") == hashlib.sha256(golden.read_bytes()).hexdigest()
    assert "sanboot --keep iscsi:" in prov.boot_script("52:54:00:00:00:01")
    prov.release("lab", "n1")
    assert prov.exports.tgt.targets() == {}


def test_writes_stay_in_the_clone_and_snapshot_keeps_them(prov: Provisioner, golden: Path, tmp_path: Path) -> None:
    gold_sha = hashlib.sha256(golden.read_bytes()).hexdigest()
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    prov.add_node("lab", "n2", "52:54:00:00:00:02")
    p1 = prov.provision("lab", "n1", "gold")
    write_export(p1.uri, 1 << 20, b"\xab" * 4096, tmp_path)
    snap = prov.snapshot("lab", "n1", "gold-snap")
    assert snap["source_node"] == "n1"
    p2 = prov.provision("lab", "n2", "gold-snap")
    got = (tmp_path / "b.raw", tmp_path / "c.raw")
    assert read_export(p2.uri, got[0]) == read_export(p1.uri, got[1]) != gold_sha
    assert got[0].read_bytes()[1 << 20 : (1 << 20) + 4096] == b"\xab" * 4096
    assert hashlib.sha256(golden.read_bytes()).hexdigest() == gold_sha  # golden untouched
    with pytest.raises(Conflict):
        prov.snapshot("lab", "n1", "gold-snap")


def test_release_keep_disk_then_discard(prov: Provisioner, golden: Path) -> None:
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    disk = Path(prov.provision("lab", "n1", "gold").disk)
    assert prov.release("lab", "n1", keep_disk=True)["state"] == NodeState.RETAINED.value
    assert disk.exists() and prov.exports.qsd.exports() == {}
    assert "not provisioned" in prov.boot_script("52:54:00:00:00:01")
    prov.provision("lab", "n1", "gold")  # the kept disk is exported again
    prov.release("lab", "n1")
    assert not disk.exists()


def test_bad_requests(prov: Provisioner, golden: Path) -> None:
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    with pytest.raises(NotFound, match="MAC"):
        prov.boot_script("52:54:00:00:00:99")
    with pytest.raises(ConfigError):
        prov.boot_script("not-a-mac")
    with pytest.raises(NotFound):
        prov.provision("lab", "n1", "missing")
    with pytest.raises(NotFound):
        prov.provision("other", "n1", "gold")  # another project's node
    with pytest.raises(Conflict, match="MAC"):
        prov.add_node("other", "x", "52-54-00-00-00-01")
    with pytest.raises(ConfigError, match="power"):
        prov.add_node("lab", "n2", "52:54:00:00:00:02", power="wol")
    with pytest.raises(ConfigError, match=r"power\.kernal"):
        prov.add_node("lab", "n2", "52:54:00:00:00:02", params={"kernal": "x"})
    # The golden image vanished under the service: a clean error, no leftovers.
    Path(prov.list_images and prov.images.image_path("lab", "gold", "raw")).unlink()
    with pytest.raises(ProvisioningError, match="missing"):
        prov.provision("lab", "n1", "gold")
    assert live(prov)[1] == set() and prov.list_nodes("lab")[0]["state"] == "free"


def test_concurrent_provision_release_leaks_nothing(prov: Provisioner, golden: Path) -> None:
    prov.import_image("lab", "gold", golden)
    nodes = [f"n{i}" for i in range(5)]
    for i, n in enumerate(nodes):
        prov.add_node("lab", n, f"52:54:00:00:01:{i:02x}")
    rng = random.Random(7)
    ops = [(rng.choice(nodes), rng.random() < 0.6) for _ in range(50)]

    def run(op: tuple[str, bool]) -> None:
        node, up = op
        if up:
            prov.provision("lab", node, "gold")
        else:
            prov.release("lab", node)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, ops))
    provisioned = {n["name"] for n in prov.list_nodes("lab") if n["state"] == "provisioned"}
    exports, clones = live(prov)
    assert len(exports) == len(provisioned) and clones == {f"{n}.qcow2" for n in provisioned}
    for n in nodes:
        prov.release("lab", n)
    assert live(prov) == (set(), set())


def test_reconcile_after_crash(prov: Provisioner, golden: Path, config) -> None:  # type: ignore[no-untyped-def]
    prov.import_image("lab", "gold", golden)
    prov.add_node("lab", "n1", "52:54:00:00:00:01")
    prov.add_node("lab", "n2", "52:54:00:00:00:02")
    prov.provision("lab", "n1", "gold")
    prov.provision("lab", "n2", "gold", ExportKind.ISCSI)
    # Crash: the storage daemon dies (every NBD and FUSE export with it), a stray
    # export and an orphan clone appear.
    prov.exports.qsd.daemon.stop()
    orphan = prov.config.path("clones", "lab", "ghost.qcow2")
    orphan.write_bytes(b"")
    prov.exports.qsd.ensure_running()
    prov.exports.qsd.add_disk("lab.ghost", Path(prov.images.image_path("lab", "gold", "raw")), fmt="raw")
    prov.exports.qsd.export_nbd("lab.ghost", "lab.ghost")
    prov.close()
    restarted = Provisioner(config)
    report = restarted.reconcile()
    assert sorted(report.restored) == ["lab.n1", "lab.n2"]
    assert "ghost.qcow2" in report.removed and not orphan.exists()
    assert len(restarted.exports.qsd.exports()) == 2  # n1's NBD + n2's FUSE backing
    assert restarted.reconcile().restored == []  # converged
    for n in ("n1", "n2"):
        restarted.release("lab", n)
    assert restarted.exports.qsd.exports() == {} and restarted.exports.tgt.targets() == {}


def test_iscsi_raw_copy_backing(config, golden: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config.iscsi_backing = IscsiBacking.RAW_COPY  # what a host without /dev/fuse gets
    prov = Provisioner(config)
    try:
        prov.create_project("lab")
        prov.import_image("lab", "gold", golden)
        prov.add_node("lab", "n1", "52:54:00:00:00:01")
        placement = prov.provision("lab", "n1", "gold", ExportKind.ISCSI)
        assert placement.disk.endswith("n1.raw") and prov.exports.qsd.exports() == {}
        assert read_export(placement.uri, tmp_path / "a.raw") == hashlib.sha256(golden.read_bytes()).hexdigest()
        prov.release("lab", "n1")
        assert not Path(placement.disk).exists() and prov.exports.tgt.targets() == {}
    finally:
        prov.close(stop_daemons=True)
