"""Userspace iSCSI targets through tgtd, managed with ``tgtadm``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from carina.core.errors import BackendUnavailable, ProvisioningError
from carina.infra.provision.daemon import Daemon

__all__ = ["TgtServer"]

_TARGET = re.compile(r"^Target (\d+): (\S+)$", re.MULTILINE)


class TgtServer:
    """One tgtd (portal ``host:port``, management channel ``control``) and its targets.

    Args:
        run_dir: Where tgtd's pid and log live.
        host: Portal address.
        port: Portal port.
        control: tgtd management channel number (``tgtd -C`` / ``tgtadm -C``).
    """

    def __init__(self, run_dir: Path, *, host: str, port: int, control: int) -> None:
        self.host, self.port, self.control = host, port, control
        self.daemon = Daemon("tgtd", run_dir)

    def ensure_running(self) -> bool:
        """Start tgtd unless a live one answers; True if it was started now."""
        if self.daemon.pid() is not None and self._answers():
            return False
        self.daemon.stop()
        argv = ["tgtd", "-f", "-C", str(self.control), "--iscsi", f"portal={self.host}:{self.port}"]
        self.daemon.start(argv, ready=self._answers)
        return True

    def stop(self) -> None:
        """Stop tgtd (its targets disappear with it)."""
        self.daemon.stop()

    def _answers(self) -> bool:
        try:
            self._adm("--op", "show", "--mode", "sys")
        except ProvisioningError:
            return False
        return True

    def _adm(self, *args: str) -> str:
        try:
            done = subprocess.run(
                ["tgtadm", "-C", str(self.control), "--lld", "iscsi", *args],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except FileNotFoundError as exc:
            raise BackendUnavailable("tgtadm missing: apt-get install tgt") from exc
        if done.returncode != 0:
            raise ProvisioningError(f"tgtadm {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def targets(self) -> dict[str, int]:
        """Live targets: IQN to target id."""
        return {iqn: int(tid) for tid, iqn in _TARGET.findall(self._adm("--op", "show", "--mode", "target"))}

    def add(self, iqn: str, backing: Path) -> int:
        """Create target ``iqn`` with LUN 1 on ``backing`` open to all initiators; return its tid.

        A half-made target is deleted again if a later step fails.
        """
        live = self.targets()
        if iqn in live:
            return live[iqn]
        tid = str(max(live.values(), default=0) + 1)
        self._adm("--op", "new", "--mode", "target", "--tid", tid, "-T", iqn)
        try:
            self._adm("--op", "new", "--mode", "logicalunit", "--tid", tid, "--lun", "1", "-b", str(backing))
            self._adm("--op", "bind", "--mode", "target", "--tid", tid, "-I", "ALL")
        except ProvisioningError:
            self._adm("--op", "delete", "--mode", "target", "--tid", tid, "--force")
            raise
        return int(tid)

    def remove(self, iqn: str) -> None:
        """Delete target ``iqn`` (dropping sessions); absent is fine."""
        tid = self.targets().get(iqn)
        if tid is not None:
            self._adm("--op", "delete", "--mode", "target", "--tid", str(tid), "--force")
