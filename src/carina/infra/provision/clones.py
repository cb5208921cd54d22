"""Copy-on-write clones of images, behind a driver interface.

:class:`QcowOverlayDriver` makes a qcow2 overlay whose backing file is the image: O(1)
to create, reads fall through to the image, writes stay in the clone.
:class:`RbdDriver` does the same with Ceph RBD (clone of a protected snapshot) for
deployments that outgrow one host; it needs the ``rbd``/``rados`` Python bindings and
a reachable cluster, and says so otherwise.
"""

from __future__ import annotations

import abc
import importlib.util
from pathlib import Path
from typing import Any, ClassVar

from carina.core.backend import Backend
from carina.core.errors import BackendUnavailable, ProvisioningError
from carina.infra.provision.imagefile import qemu_img
from carina.infra.provision.qsd import StorageDaemon

__all__ = ["CloneDriver", "QcowOverlayDriver", "QsdOverlayDriver", "RbdDriver"]


class CloneDriver(Backend):
    """Make, flatten and delete per-node clones of an image.

    Public methods validate and call the ``_create``/``_flatten``/``_delete`` hooks.
    """

    @abc.abstractmethod
    def _create(self, image: Path, image_format: str, dest: Path) -> None: ...

    @abc.abstractmethod
    def _flatten(self, clone: Path, dest: Path) -> None: ...

    @abc.abstractmethod
    def _delete(self, clone: Path) -> None: ...

    def create(self, image: Path, image_format: str, dest: Path) -> Path:
        """Clone ``image`` into ``dest`` (which must not exist); return ``dest``."""
        if image_format not in ("raw", "qcow2"):
            raise ProvisioningError(f"cannot clone a {image_format} image", path=str(image))
        existed = dest.exists()
        try:
            self._create(image, image_format, dest)
        except BaseException:
            if not existed:
                dest.unlink(missing_ok=True)
            raise
        return dest

    def flatten(self, clone: Path, dest: Path) -> Path:
        """Write a standalone copy of ``clone`` (no backing image) to ``dest``."""
        existed = dest.exists()
        try:
            self._flatten(clone, dest)
        except BaseException:
            if not existed:
                dest.unlink(missing_ok=True)
            raise
        return dest

    def delete(self, clone: Path) -> None:
        """Delete a clone; a missing one is fine."""
        self._delete(clone)


class QcowOverlayDriver(CloneDriver):
    """qcow2 overlays on a local (or shared) filesystem, made with ``qemu-img``."""

    name: ClassVar[str] = "qcow2"

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Needs qemu-img."""
        import shutil

        return [] if shutil.which("qemu-img") else ["qemu-img missing: apt-get install qemu-utils"]

    def _create(self, image: Path, image_format: str, dest: Path) -> None:
        if not image.is_file():
            raise ProvisioningError("image file is missing", path=str(image))
        if dest.exists():
            raise ProvisioningError("a clone already exists there", path=str(dest))
        dest.parent.mkdir(parents=True, exist_ok=True)
        qemu_img("create", "-q", "-f", "qcow2", "-b", str(image.resolve()), "-F", image_format, str(dest))

    def _flatten(self, clone: Path, dest: Path) -> None:
        if not clone.is_file():
            raise ProvisioningError("clone is missing", path=str(clone))
        qemu_img("convert", "-q", "-f", "qcow2", "-O", "qcow2", str(clone), str(dest))

    def _delete(self, clone: Path) -> None:
        clone.unlink(missing_ok=True)


class QsdOverlayDriver(QcowOverlayDriver):
    """qcow2 overlays created by the running qemu-storage-daemon over QMP (no process spawn).

    Args:
        qsd: The storage daemon (started on demand).
    """

    name: ClassVar[str] = "qcow2-qmp"

    def __init__(self, qsd: StorageDaemon) -> None:
        self.qsd = qsd

    def _create(self, image: Path, image_format: str, dest: Path) -> None:
        if not image.is_file():
            raise ProvisioningError("image file is missing", path=str(image))
        if dest.exists():
            raise ProvisioningError("a clone already exists there", path=str(dest))
        dest.parent.mkdir(parents=True, exist_ok=True)
        size = image.stat().st_size if image_format == "raw" else _virtual_size(image)
        self.qsd.ensure_running()
        self.qsd.create_overlay(f"new:{dest}", dest, backing=image.resolve(), backing_format=image_format, size=size)


def _virtual_size(image: Path) -> int:
    import json

    return int(json.loads(qemu_img("info", "--output=json", "-f", "qcow2", str(image)))["virtual-size"])


class RbdDriver(CloneDriver):
    """Ceph RBD clones: snapshot + protect the image, clone per node, flatten for snapshots.

    Paths are read as ``<pool>/<image>`` names. Needs ``python3-rbd``/``python3-rados``
    and a Ceph config that reaches a cluster.
    """

    name: ClassVar[str] = "rbd"
    SNAP: ClassVar[str] = "carina-golden"

    def __init__(self, conffile: str = "/etc/ceph/ceph.conf") -> None:
        self.conffile = conffile

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Needs the bindings and a Ceph config file."""
        reasons = []
        for mod in ("rados", "rbd"):
            if importlib.util.find_spec(mod) is None:
                reasons.append(f"python module {mod!r} missing: apt-get install python3-{mod}")
        if not Path(self.conffile).is_file():
            reasons.append(f"no Ceph cluster configured ({self.conffile} absent)")
        return reasons

    def _ioctx(self, pool: str) -> Any:
        reasons = self.unsupported_reasons()
        if reasons:
            raise BackendUnavailable("; ".join(reasons))
        import rados

        cluster = rados.Rados(conffile=self.conffile)
        cluster.connect()
        return cluster.open_ioctx(pool)

    def _create(self, image: Path, image_format: str, dest: Path) -> None:
        import rbd

        pool, parent = image.parent.name, image.name
        ioctx = self._ioctx(pool)
        with rbd.Image(ioctx, parent) as img:
            if self.SNAP not in {s["name"] for s in img.list_snaps()}:
                img.create_snap(self.SNAP)
                img.protect_snap(self.SNAP)
        rbd.RBD().clone(ioctx, parent, self.SNAP, ioctx, dest.name, features=rbd.RBD_FEATURE_LAYERING)

    def _flatten(self, clone: Path, dest: Path) -> None:
        import rbd

        ioctx = self._ioctx(clone.parent.name)
        with rbd.Image(ioctx, clone.name) as img:
            img.copy(ioctx, dest.name)
        with rbd.Image(ioctx, dest.name) as copy:
            copy.flatten()

    def _delete(self, clone: Path) -> None:
        import rbd

        rbd.RBD().remove(self._ioctx(clone.parent.name), clone.name)
