"""The provisioning service: golden image -> COW clone -> block export -> iPXE script -> boot.

:class:`Provisioner` is the one object the REST API and the CLI drive. Every
state-changing call holds an exclusive lock on the state directory (threads and
processes alike), so concurrent requests serialise and none leaks a clone or export;
each call either completes or undoes what it did.

    prov = Provisioner(ProvisionConfig(state_dir=Path("state")))
    token = prov.create_project("lab")
    prov.import_image("lab", "debian", Path("golden.raw"))
    prov.add_node("lab", "n1", "52:54:00:00:00:01", power="qemu", params={...})
    placement = prov.provision("lab", "n1", "debian", ExportKind.NBD)
    prov.release("lab", "n1")
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from carina.core.errors import ConfigError
from carina.infra.provision.boot import BootTarget, normalize_mac, render_ipxe, render_no_disk
from carina.infra.provision.clones import CloneDriver, QsdOverlayDriver
from carina.infra.provision.config import ExportKind, IscsiBacking, NodeState, ProvisionConfig, check_name
from carina.infra.provision.errors import Conflict, NotFound
from carina.infra.provision.exports import ExportManager, ReconcileReport, WantedExport
from carina.infra.provision.imagefile import qemu_img
from carina.infra.provision.images import ImageCatalog
from carina.infra.provision.power import NodeHandle, PowerDriver, power_driver
from carina.infra.provision.state import ImageRow, NodeRow, ProjectRow, hash_token, new_token, open_database

__all__ = ["Placement", "Provisioner"]


@dataclass(frozen=True)
class Placement:
    """A provisioned node: which image, which disk, where it is served, how it boots."""

    project: str
    node: str
    mac: str
    image: str
    export: ExportKind
    uri: str
    disk: str
    boot_script: str


class Provisioner:
    """Images, nodes, clones, exports and boot scripts of one state directory."""

    def __init__(self, config: ProvisionConfig, *, clones: CloneDriver | None = None) -> None:
        self.config = config
        config.path().mkdir(parents=True, exist_ok=True)
        self.sessions = open_database(config.db_url)
        self.images = ImageCatalog(config)
        self.exports = ExportManager(config)
        self.clones = clones or QsdOverlayDriver(self.exports.qsd)
        self._thread_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[Session]:
        with self._thread_lock, self.config.path("lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            with self.sessions() as session:
                yield session

    def _project(self, session: Session, name: str) -> ProjectRow:
        row = session.scalar(select(ProjectRow).where(ProjectRow.name == name))
        if row is None:
            raise NotFound(f"no project {name!r}", project=name)
        return row

    def _node(self, session: Session, project: ProjectRow, name: str) -> NodeRow:
        row = session.scalar(select(NodeRow).where(NodeRow.project_id == project.id, NodeRow.name == name))
        if row is None:
            raise NotFound(f"no node {name!r} in project {project.name!r}", node=name)
        return row

    @staticmethod
    def key(project: str, node: str) -> str:
        """The name of a node's disk in exports and files."""
        return f"{project}.{node}"  # unambiguous: project names have no dots

    def close(self, *, stop_daemons: bool = False) -> None:
        """Release the database; with ``stop_daemons`` also stop qemu-storage-daemon and tgtd."""
        if stop_daemons:
            self.exports.stop()
        self.sessions.kw["bind"].dispose()

    # -- projects -------------------------------------------------------------
    def create_project(self, name: str, *, token: str | None = None) -> str:
        """Create a project and return its API token (shown once; only a hash is kept)."""
        check_name(name, key="project")
        if "." in name:
            raise ConfigError(f"project name {name!r} must not contain '.'", key="project")
        token = token or new_token()
        with self._locked() as s:
            s.add(ProjectRow(name=name, token_sha256=hash_token(token)))
            try:
                s.commit()
            except IntegrityError as exc:
                raise Conflict(f"project {name!r} exists", project=name) from exc
        return token

    def rotate_token(self, name: str) -> str:
        """Issue a new token for project ``name`` (the old one stops working)."""
        token = new_token()
        with self._locked() as s:
            self._project(s, name).token_sha256 = hash_token(token)
            s.commit()
        return token

    def ensure_project(self, name: str) -> None:
        """Create ``name`` (with an unusable random token) unless it exists."""
        with self.sessions() as s:
            if s.scalar(select(ProjectRow.id).where(ProjectRow.name == name)) is not None:
                return
        with contextlib.suppress(Conflict):
            self.create_project(name)

    def project_for_token(self, token: str) -> str | None:
        """The project a token authenticates, or None."""
        with self.sessions() as s:
            return s.scalar(select(ProjectRow.name).where(ProjectRow.token_sha256 == hash_token(token)))

    # -- images ---------------------------------------------------------------
    def import_image(
        self, project: str, name: str, source: Path, *, fmt: str | None = None, sha256: str | None = None
    ) -> dict[str, Any]:
        """Import a raw or qcow2 golden image; see :meth:`ImageCatalog.add`."""
        with self._locked() as s:
            return self.images.add(s, self._project(s, project), name, source, fmt=fmt, sha256=sha256).to_dict()

    def list_images(self, project: str) -> list[dict[str, Any]]:
        """Images of ``project``."""
        with self.sessions() as s:
            return [r.to_dict() for r in self.images.list(s, self._project(s, project))]

    def delete_image(self, project: str, name: str) -> None:
        """Delete an image; refused (Conflict) while clones of it exist."""
        with self._locked() as s:
            self.images.remove(s, self._project(s, project), name)

    def snapshot(self, project: str, node: str, name: str) -> dict[str, Any]:
        """Save ``node``'s disk as a new standalone image ``name``.

        The export is detached while the disk is copied (so every write is flushed
        and the copy is consistent) and attached again afterwards.
        """
        with self._locked() as s:
            proj = self._project(s, project)
            row = self._node(s, proj, node)
            if row.state == NodeState.FREE.value or not row.disk_path:
                raise Conflict(f"node {node!r} has no disk to snapshot", node=node)
            want = self._wanted(project, row)
            if row.state == NodeState.PROVISIONED.value:
                self.exports.remove(want.key, want.kind)
            try:
                image = self.images.add_flattened(s, proj, name, row, lambda dest: self._flatten(want.disk, dest))
            finally:
                if row.state == NodeState.PROVISIONED.value:
                    self.exports.add(want)
            return image.to_dict()

    def _flatten(self, disk: Path, dest: Path) -> None:
        if disk.suffix == ".raw":
            qemu_img("convert", "-q", "-f", "raw", "-O", "qcow2", str(disk), str(dest))
        else:
            self.clones.flatten(disk, dest)

    # -- nodes ----------------------------------------------------------------
    def add_node(
        self, project: str, name: str, mac: str, *, power: str = "qemu", params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Register a node by MAC with a power driver (``qemu`` or ``ipmi``) and its parameters."""
        check_name(name, key="name")
        mac = normalize_mac(mac)
        params = power_driver(power).check_params(dict(params or {}))
        with self._locked() as s:
            proj = self._project(s, project)
            if s.scalar(select(NodeRow.id).where(NodeRow.mac == mac)) is not None:
                raise Conflict(f"MAC {mac} is already registered", mac=mac)
            if s.scalar(select(NodeRow.id).where(NodeRow.project_id == proj.id, NodeRow.name == name)):
                raise Conflict(f"node {name!r} exists in project {project!r}", node=name)
            row = NodeRow(project_id=proj.id, name=name, mac=mac, power_driver=power, power_params=params)
            s.add(row)
            s.commit()
            return self._node_view(s, row)

    def list_nodes(self, project: str) -> list[dict[str, Any]]:
        """Nodes of ``project`` with their state, image and export."""
        with self.sessions() as s:
            proj = self._project(s, project)
            rows = s.scalars(select(NodeRow).where(NodeRow.project_id == proj.id).order_by(NodeRow.name))
            return [self._node_view(s, r) for r in rows]

    def _node_view(self, s: Session, row: NodeRow) -> dict[str, Any]:
        image = s.get(ImageRow, row.image_id) if row.image_id else None
        return {
            "name": row.name,
            "mac": row.mac,
            "power": row.power_driver,
            "state": row.state,
            "image": image.name if image else None,
            "export": row.export_kind,
        }

    def provision(self, project: str, node: str, image: str, export: ExportKind = ExportKind.NBD) -> Placement:
        """Give ``node`` a COW clone of ``image``, export it, and bind its boot script.

        Idempotent: provisioning a node again with the same image and export returns
        the same placement (re-creating the export if it went missing).

        Raises:
            NotFound: Unknown project, node or image.
            Conflict: The node holds a disk of another image or export kind.
        """
        export = ExportKind(export)
        with self._locked() as s:
            proj = self._project(s, project)
            row = self._node(s, proj, node)
            img = self.images.get(s, proj, image)
            if row.state != NodeState.FREE.value:
                if row.image_id != img.id or row.export_kind != export.value:
                    raise Conflict(f"node {node!r} already has a disk; release it first", node=node)
                want = self._wanted(project, row)
                if not self.exports.exists(want):
                    self.exports.add(want)
            else:
                want = self._make_disk(project, row, img, export)
                row.state, row.image_id = NodeState.PROVISIONED.value, img.id
                row.export_kind, row.disk_path = export.value, str(want.disk)
                try:
                    s.commit()
                except BaseException:
                    self.exports.remove(want.key, want.kind)
                    self.clones.delete(want.disk)
                    raise
            row.state = NodeState.PROVISIONED.value
            s.commit()
            return self._placement(project, row, img)

    def _make_disk(self, project: str, row: NodeRow, img: ImageRow, export: ExportKind) -> WantedExport:
        key = self.key(project, row.name)
        raw = export is ExportKind.ISCSI and self.exports.iscsi_backing() is IscsiBacking.RAW_COPY
        disk = self.config.path("clones", project, f"{row.name}.{'raw' if raw else 'qcow2'}")
        if raw:
            disk.parent.mkdir(parents=True, exist_ok=True)
            qemu_img("convert", "-q", "-f", img.format, "-O", "raw", img.path, str(disk))
        else:
            self.clones.create(Path(img.path), img.format, disk)
        want = WantedExport(key, export, disk)
        try:
            self.exports.add(want)
        except BaseException:
            self.clones.delete(disk)
            raise
        return want

    def _wanted(self, project: str, row: NodeRow) -> WantedExport:
        assert row.export_kind and row.disk_path
        return WantedExport(self.key(project, row.name), ExportKind(row.export_kind), Path(row.disk_path))

    def _placement(self, project: str, row: NodeRow, img: ImageRow) -> Placement:
        want = self._wanted(project, row)
        target = self.exports.target(want.key, want.kind)
        return Placement(
            project=project,
            node=row.name,
            mac=row.mac,
            image=img.name,
            export=want.kind,
            uri=target.uri,
            disk=str(want.disk),
            boot_script=self._script(row, target),
        )

    def _script(self, row: NodeRow, target: BootTarget) -> str:
        base = f"{self.config.node_boot_url}/boot/files"
        return render_ipxe(
            dataclasses.replace(target, host=self.config.node_host),
            node=row.name,
            mac=row.mac,
            kernel_url=f"{base}/vmlinuz",
            initrd_url=f"{base}/initrd.gz",
            cmdline=self.config.kernel_cmdline,
        )

    def release(self, project: str, node: str, *, keep_disk: bool = False) -> dict[str, Any]:
        """Power the node off, remove its export, and delete its clone (unless ``keep_disk``).

        Releasing a free node is a no-op. A kept disk (state ``retained``) can be
        snapshotted, re-provisioned with the same image, or released again to delete it.
        """
        with self._locked() as s:
            proj = self._project(s, project)
            row = self._node(s, proj, node)
            if row.state == NodeState.FREE.value:
                return self._node_view(s, row)
            handle = self._handle(project, row, with_disk=False)
            driver = power_driver(row.power_driver)
            if driver.name == "qemu":
                driver.off(handle)
            want = self._wanted(project, row)
            self.exports.remove(want.key, want.kind)
            if keep_disk:
                row.state = NodeState.RETAINED.value
            else:
                self.clones.delete(want.disk)
                row.state, row.image_id, row.export_kind, row.disk_path = NodeState.FREE.value, None, None, None
            s.commit()
            return self._node_view(s, row)

    # -- boot and power -------------------------------------------------------
    def boot_script(self, mac: str) -> str:
        """The iPXE script bound to ``mac`` (NotFound for an unknown MAC)."""
        mac = normalize_mac(mac)
        with self.sessions() as s:
            row = s.scalar(select(NodeRow).where(NodeRow.mac == mac))
            if row is None:
                raise NotFound(f"no node has MAC {mac}", mac=mac)
            if row.state != NodeState.PROVISIONED.value:
                return render_no_disk(row.name)
            proj = s.get(ProjectRow, row.project_id)
            img = s.get(ImageRow, row.image_id)
            assert proj is not None and img is not None
            return self._placement(proj.name, row, img).boot_script

    def _handle(self, project: str, row: NodeRow, *, with_disk: bool = True) -> NodeHandle:
        uri = None
        if with_disk and row.state == NodeState.PROVISIONED.value:
            want = self._wanted(project, row)
            uri = self.exports.target(want.key, want.kind).uri
        return NodeHandle(self.key(project, row.name), row.mac, uri, self.config.path("run"), dict(row.power_params))

    def node_power(self, project: str, node: str) -> tuple[PowerDriver, NodeHandle]:
        """The power driver and handle of ``node`` (to switch it on, read its console)."""
        with self.sessions() as s:
            row = self._node(s, self._project(s, project), node)
            return power_driver(row.power_driver), self._handle(project, row)

    def power_on(self, project: str, node: str) -> NodeHandle:
        """Switch ``node`` on; it boots from its network disk."""
        driver, handle = self.node_power(project, node)
        if handle.disk_uri is None:
            raise Conflict(f"node {node!r} is not provisioned", node=node)
        driver.on(handle)
        return handle

    # -- crash recovery -------------------------------------------------------
    def reconcile(self) -> ReconcileReport:
        """Bring daemons in line with the database (run at service start-up).

        Exports of provisioned nodes are re-created if missing; exports and clone
        files no node owns are removed.
        """
        with self._locked() as s:
            wanted: list[WantedExport] = []
            owned_disks: set[Path] = set()
            for row, proj_name in s.execute(select(NodeRow, ProjectRow.name).join(ProjectRow)):
                if row.disk_path:
                    owned_disks.add(Path(row.disk_path))
                if row.state == NodeState.PROVISIONED.value:
                    wanted.append(self._wanted(proj_name, row))
            report = self.exports.reconcile(wanted)
            for path in sorted(self.config.path("clones").glob("*/*")):
                if path not in owned_disks:
                    path.unlink()
                    report.removed.append(str(path.name))
            return report
