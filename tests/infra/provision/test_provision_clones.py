from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from carina.core.errors import ProvisioningError
from carina.infra.provision.clones import QcowOverlayDriver, RbdDriver


def test_overlay_is_cow_and_never_clobbers(golden: Path, tmp_path: Path) -> None:
    drv = QcowOverlayDriver()
    clone = drv.create(golden, "raw", tmp_path / "c" / "n1.qcow2")
    info = subprocess.run(["qemu-img", "info", "--output=json", str(clone)], capture_output=True, text=True, check=True)
    assert str(golden.resolve()) in info.stdout and clone.stat().st_size < 1 << 20
    before = clone.read_bytes()
    with pytest.raises(ProvisioningError, match="already exists"):
        drv.create(golden, "raw", clone)
    assert clone.read_bytes() == before  # the failed second create left the first alone
    flat = drv.flatten(clone, tmp_path / "flat.qcow2")
    assert (
        "backing"
        not in subprocess.run(["qemu-img", "info", str(flat)], capture_output=True, text=True, check=True).stdout
    )
    drv.delete(clone)
    drv.delete(clone)  # idempotent
    assert not clone.exists()
    with pytest.raises(ProvisioningError, match="cannot clone"):
        drv.create(golden, "vmdk", tmp_path / "x.qcow2")


def test_rbd_driver_against_a_cluster() -> None:
    drv = RbdDriver()
    reasons = drv.unsupported_reasons()
    if reasons:
        pytest.skip("no Ceph cluster: " + "; ".join(reasons))
    name = f"carina-test-{uuid.uuid4().hex[:8]}"
    import rados
    import rbd

    cluster = rados.Rados(conffile=drv.conffile)
    cluster.connect()
    ioctx = cluster.open_ioctx("rbd")
    rbd.RBD().create(ioctx, name, 4 << 20)
    try:
        clone = drv.create(Path("rbd") / name, "raw", Path("rbd") / f"{name}-c")
        flat = drv.flatten(clone, Path("rbd") / f"{name}-f")
        assert {f"{name}-c", f"{name}-f"} <= set(rbd.RBD().list(ioctx))
        drv.delete(flat)
        drv.delete(clone)
        assert not {f"{name}-c", f"{name}-f"} & set(rbd.RBD().list(ioctx))
    finally:
        with rbd.Image(ioctx, name) as img:
            img.unprotect_snap(RbdDriver.SNAP)
            img.remove_snap(RbdDriver.SNAP)
        rbd.RBD().remove(ioctx, name)
