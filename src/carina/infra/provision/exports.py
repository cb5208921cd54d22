"""Block exports of node disks: NBD from qemu-storage-daemon, iSCSI from tgtd.

:class:`ExportManager` adds and removes one node's export, and reconciles the live
daemons with the database after a crash (missing exports are re-created, exports
nobody owns are removed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from carina.infra.provision.boot import BootTarget
from carina.infra.provision.config import ExportKind, IscsiBacking, ProvisionConfig
from carina.infra.provision.iscsi import TgtServer
from carina.infra.provision.qsd import StorageDaemon, qmp_names

__all__ = ["ExportManager", "ReconcileReport", "WantedExport"]


@dataclass(frozen=True)
class WantedExport:
    """One export the database says should exist."""

    key: str  # "<project>-<node>"
    kind: ExportKind
    disk: Path


@dataclass
class ReconcileReport:
    """What :meth:`ExportManager.reconcile` changed."""

    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


class ExportManager:
    """Owns the storage daemon and the iSCSI server of one state directory."""

    def __init__(self, config: ProvisionConfig) -> None:
        self.config = config
        run = config.path("run")
        self.qsd = StorageDaemon(run, host=config.listen_host, port=config.nbd_port, link_rate_bps=config.link_rate_bps)
        control = config.tgt_control_port or (config.iscsi_port % 32767) + 1
        self.tgt = TgtServer(run, host=config.listen_host, port=config.iscsi_port, control=control)

    def target(self, key: str, kind: ExportKind) -> BootTarget:
        """Where the export of ``key`` is served."""
        if kind is ExportKind.NBD:
            return BootTarget(kind, self.config.listen_host, self.config.nbd_port, key)
        return BootTarget(kind, self.config.listen_host, self.config.iscsi_port, f"{self.config.iqn_prefix}:{key}")

    def add(self, want: WantedExport) -> BootTarget:
        """Export ``want.disk``; on failure nothing of it is left behind."""
        self.qsd.ensure_running()
        target = self.target(want.key, want.kind)
        try:
            if want.kind is ExportKind.NBD:
                self.qsd.add_nbd_disk(want.key, want.disk, want.key)
            else:
                self.tgt.ensure_running()
                self.tgt.add(target.name, self._iscsi_backing(want))
        except BaseException:
            self.remove(want.key, want.kind)
            raise
        return target

    def remove(self, key: str, kind: ExportKind) -> None:
        """Remove the export of ``key`` (absent parts are fine)."""
        if kind is ExportKind.ISCSI and self.tgt.daemon.pid() is not None:
            self.tgt.remove(self.target(key, kind).name)
        if self.qsd.daemon.pid() is not None:
            self.qsd.remove(key)
        self._backing_path(key).unlink(missing_ok=True)

    def exists(self, want: WantedExport) -> bool:
        """Whether the export of ``want`` is live."""
        qsd_live = self.qsd.daemon.pid() is not None and qmp_names(want.key)[1] in self.qsd.exports()
        if want.kind is ExportKind.NBD:
            return qsd_live
        tgt_live = self.tgt.daemon.pid() is not None and self.target(want.key, want.kind).name in self.tgt.targets()
        return tgt_live and (qsd_live or want.disk.suffix == ".raw")

    def iscsi_backing(self) -> IscsiBacking:
        """The iSCSI backing in effect (AUTO resolved)."""
        if self.config.iscsi_backing is not IscsiBacking.AUTO:
            return self.config.iscsi_backing
        return IscsiBacking.FUSE if os.access("/dev/fuse", os.R_OK | os.W_OK) else IscsiBacking.RAW_COPY

    def _backing_path(self, key: str) -> Path:
        return self.config.path("run", "luns", f"{key}.raw")

    def _iscsi_backing(self, want: WantedExport) -> Path:
        lun = self._backing_path(want.key)
        lun.parent.mkdir(parents=True, exist_ok=True)
        if want.disk.suffix == ".raw":  # RAW_COPY: tgtd serves the flattened clone itself
            return want.disk
        self.qsd.add_disk(want.key, want.disk)
        self.qsd.export_fuse(want.key, lun)
        return lun

    def reconcile(self, wanted: list[WantedExport]) -> ReconcileReport:
        """Make the live exports exactly ``wanted``."""
        report = ReconcileReport()
        keys = {w.key for w in wanted}
        self.qsd.ensure_running()
        need_tgt = any(w.kind is ExportKind.ISCSI for w in wanted) or self.tgt.daemon.pid() is not None
        if need_tgt:
            self.tgt.ensure_running()
            prefix = f"{self.config.iqn_prefix}:"
            for iqn in self.tgt.targets():
                if iqn.removeprefix(prefix) not in keys:
                    self.tgt.remove(iqn)
                    report.removed.append(iqn)
        report.removed += self.qsd.remove_strays(keys)
        for want in wanted:
            if not self.exists(want):
                self.remove(want.key, want.kind)  # half-present parts (a disk without its export)
                self.add(want)
                report.restored.append(want.key)
        return report

    def stop(self) -> None:
        """Stop both daemons."""
        self.tgt.stop()
        self.qsd.stop()
