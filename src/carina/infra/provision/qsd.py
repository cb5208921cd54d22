"""One long-running qemu-storage-daemon, driven over QMP with ``qemu.qmp``.

Each node's disk is a block node (qcow2 on a file, optionally behind a shared
throttle group that models the network link) exported over NBD, or over FUSE as a
raw file that tgtd serves by iSCSI. QMP names are derived from the node's key, so a
restarted service finds its own exports again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from carina.core.errors import ProvisioningError
from carina.infra.provision.daemon import Daemon

__all__ = ["LINK_GROUP", "StorageDaemon", "qmp_names"]

LINK_GROUP = "carina-link"
# Creating an overlay writes a few metadata clusters; QEMU flushes after each step. One
# fsync of the finished file (by the caller) gives the same durability for far less time.
_NO_FLUSH: dict[str, Any] = {"cache": {"no-flush": True}}
WAIT_JOB = "carina-wait-job"  # pseudo-command: wait for a job to conclude, then dismiss it


def qmp_names(key: str) -> tuple[str, str]:
    """``(node_name, export_id)`` for a disk key; QEMU limits node names to 31 characters."""
    h = hashlib.sha1(key.encode()).hexdigest()[:16]
    return f"cd{h}", f"ce{h}"


class StorageDaemon:
    """Start or reuse qemu-storage-daemon and manage its block nodes and exports.

    Args:
        run_dir: Where the QMP socket, pid and log live.
        host: NBD server address.
        port: NBD server port.
        link_rate_bps: Total bytes/s of all throttled disks (0 = no throttle group).
    """

    def __init__(self, run_dir: Path, *, host: str, port: int, link_rate_bps: int = 0) -> None:
        self.socket = run_dir / "qsd.qmp"
        self.host, self.port, self.link_rate_bps = host, port, link_rate_bps
        self.daemon = Daemon("qemu-storage-daemon", run_dir)

    # -- life cycle -----------------------------------------------------------
    def ensure_running(self) -> bool:
        """Start the daemon unless a live one is answering; True if it was started now."""
        if self.daemon.pid() is not None and self._answers():
            return False
        self.daemon.stop()
        self.socket.unlink(missing_ok=True)
        argv = [
            "qemu-storage-daemon",
            "--chardev", f"socket,id=qmp,path={self.socket},server=on,wait=off",
            "--monitor", "chardev=qmp",
            "--nbd-server", f"addr.type=inet,addr.host={self.host},addr.port={self.port}",
        ]  # fmt: skip
        self.daemon.start(argv, ready=self._answers)
        if self.link_rate_bps:
            limits = {"bps-total": self.link_rate_bps, "bps-total-max": self.link_rate_bps}
            self.qmp([("object-add", {"qom-type": "throttle-group", "id": LINK_GROUP, "limits": limits})])
        return True

    def stop(self) -> None:
        """Stop the daemon (exports disappear with it)."""
        if self.daemon.pid() is not None and self._answers():
            try:
                self.qmp([("quit", {})])
            except ProvisioningError:
                pass
        self.daemon.stop()
        self.socket.unlink(missing_ok=True)

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.socket))
            except OSError:
                return False
        return True

    # -- QMP ------------------------------------------------------------------
    def qmp(self, commands: Sequence[tuple[str, dict[str, Any]]]) -> list[Any]:
        """Run QMP commands in order on one connection; errors become ProvisioningError."""
        return asyncio.run(self._qmp(commands))

    async def _qmp(self, commands: Sequence[tuple[str, dict[str, Any]]]) -> list[Any]:
        from qemu.qmp import ExecuteError, QMPClient, QMPError

        client = QMPClient("carina")
        results: list[Any] = []
        try:
            await client.connect(str(self.socket))
            for cmd, args in commands:
                if cmd == WAIT_JOB:
                    await self._finish_job(client, args["id"])
                    results.append(None)
                else:
                    results.append(await client.execute(cmd, args or None))
        except ExecuteError as exc:
            cmd = str(exc.sent.get("execute", "?"))
            raise ProvisioningError(f"QMP {cmd} failed: {exc}", socket=str(self.socket)) from exc
        except (QMPError, OSError) as exc:
            raise ProvisioningError(f"QMP session failed: {exc}", socket=str(self.socket)) from exc
        finally:
            try:
                await client.disconnect()
            except (EOFError, QMPError, OSError):
                pass  # the peer went first (after "quit")
        return results

    @staticmethod
    async def _finish_job(client: Any, job: str, timeout: float = 60.0) -> None:
        """Poll a job until it concludes, dismiss it, raise if it failed."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = {j["id"]: j for j in await client.execute("query-jobs")}
            state = jobs.get(job, {})
            if state.get("status") == "concluded":
                await client.execute("job-dismiss", {"id": job})
                if state.get("error"):
                    raise ProvisioningError(f"QMP job {job} failed: {state['error']}")
                return
            if time.monotonic() > deadline:
                raise ProvisioningError(f"QMP job {job} did not finish", job=job)
            await asyncio.sleep(0.001)

    # -- disks and exports ----------------------------------------------------
    def create_overlay(self, key: str, dest: Path, *, backing: Path, backing_format: str, size: int) -> None:
        """Create a qcow2 overlay of ``backing`` at ``dest`` inside the daemon (``blockdev-create``).

        No process is spawned: one short job on one QMP connection. ``dest`` must not exist.
        """
        node, _ = qmp_names(key)
        fnode, job = f"{node}f", f"{node}j"
        qcow2 = {
            "driver": "qcow2",
            "file": fnode,
            "size": size,
            "backing-file": str(backing),
            "backing-fmt": backing_format,
        }
        with dest.open("xb"):
            pass
        try:
            self.qmp([
                ("blockdev-add", {"driver": "file", "node-name": fnode, "filename": str(dest), **_NO_FLUSH}),
                ("blockdev-create", {"job-id": job, "options": qcow2}),
                (WAIT_JOB, {"id": job}),
                ("blockdev-del", {"node-name": fnode}),
            ])  # fmt: skip
        except ProvisioningError:
            if fnode in self.nodes():
                self.qmp([("blockdev-del", {"node-name": fnode})])
            dest.unlink(missing_ok=True)
            raise
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def add_disk(self, key: str, path: Path, *, fmt: str = "qcow2", read_only: bool = False) -> str:
        """Open ``path`` as a block node (behind the link throttle if configured)."""
        self.qmp([self._disk_cmd(key, path, fmt, read_only)])
        return qmp_names(key)[0]

    def export_nbd(self, key: str, name: str, *, writable: bool = True) -> None:
        """Export the disk of ``key`` over NBD as ``name``."""
        self.qmp([self._nbd_cmd(key, name, writable)])

    def add_nbd_disk(self, key: str, path: Path, name: str) -> None:
        """Open a qcow2 disk and export it writable over NBD, in one QMP session."""
        self.qmp([self._disk_cmd(key, path, "qcow2", False), self._nbd_cmd(key, name, True)])

    def _disk_cmd(self, key: str, path: Path, fmt: str, read_only: bool) -> tuple[str, dict[str, Any]]:
        node, _ = qmp_names(key)
        image: dict[str, Any] = {
            "driver": fmt,
            "node-name": node + ("q" if self.link_rate_bps else ""),
            "file": {"driver": "file", "filename": str(path)},
            "read-only": read_only,
        }
        if self.link_rate_bps:
            image = {"driver": "throttle", "node-name": node, "throttle-group": LINK_GROUP, "file": image}
        return "blockdev-add", image

    def _nbd_cmd(self, key: str, name: str, writable: bool) -> tuple[str, dict[str, Any]]:
        node, export = qmp_names(key)
        return "block-export-add", {"type": "nbd", "id": export, "node-name": node, "name": name, "writable": writable}

    def export_fuse(self, key: str, mountpoint: Path) -> None:
        """Expose the disk of ``key`` as a raw file at ``mountpoint`` (FUSE)."""
        node, export = qmp_names(key)
        mountpoint.touch(exist_ok=True)
        args = {"type": "fuse", "id": export, "node-name": node, "mountpoint": str(mountpoint), "writable": True}
        self.qmp([("block-export-add", args)])

    def remove(self, key: str, timeout: float = 10.0) -> None:
        """Delete the export (disconnecting clients) and close the disk; missing parts are fine."""
        self._remove_names(*qmp_names(key), timeout=timeout)

    def remove_strays(self, keys: set[str]) -> list[str]:
        """Remove every carina export and disk not belonging to ``keys``; return their ids."""
        owned = {name for key in keys for name in qmp_names(key)}
        live = set(self.exports()) | {n.removesuffix("q") for n in self.nodes()}
        strays = sorted(n for n in live if n[:2] in ("cd", "ce") and n not in owned)
        for name in strays:
            suffix = name[2:]
            self._remove_names(f"cd{suffix}", f"ce{suffix}")
        return sorted({f"ce{n[2:]}" for n in strays})

    def _remove_names(self, node: str, export: str, timeout: float = 10.0) -> None:
        if export in self.exports():
            self.qmp([("block-export-del", {"id": export, "mode": "hard"})])
            deadline = time.monotonic() + timeout
            while export in self.exports():
                if time.monotonic() > deadline:
                    raise ProvisioningError("export did not go away", export=export)
                time.sleep(0.01)
        for name in (node, node + "q"):  # deleting the throttle node may take its child with it
            if name in self.nodes():
                self.qmp([("blockdev-del", {"node-name": name})])

    def exports(self) -> dict[str, dict[str, Any]]:
        """Live exports by id."""
        (rows,) = self.qmp([("query-block-exports", {})])
        return {r["id"]: r for r in rows}

    def nodes(self) -> set[str]:
        """Names of the top-level block nodes that are open."""
        (rows,) = self.qmp([("query-named-block-nodes", {"flat": True})])
        return {r["node-name"] for r in rows}

    def bytes_read(self, key: str) -> int:
        """Bytes read from the disk of ``key`` since it was opened."""
        node, _ = qmp_names(key)
        (stats,) = self.qmp([("query-blockstats", {"query-nodes": True})])
        for row in stats:
            if row.get("node-name") == node:
                return int(row["stats"]["rd_bytes"])
        raise ProvisioningError("no such disk in the storage daemon", node=node)
