"""Long-running helper daemons (qemu-storage-daemon, tgtd) that outlive the CLI call that started them.

A daemon is tracked by a pid file in the state directory, so a later process (the CLI,
a restarted service) finds and reuses it; :meth:`Daemon.stop` ends exactly that pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from carina.core.errors import BackendUnavailable, ProvisioningError

__all__ = ["Daemon"]


class Daemon:
    """One detached process with a pid file and a log file.

    Args:
        name: Short name used in file names and messages.
        run_dir: Where the pid and log files live.
    """

    def __init__(self, name: str, run_dir: Path) -> None:
        self.name = name
        self.run_dir = run_dir
        self.pid_file = run_dir / f"{name}.pid"
        self.log_file = run_dir / f"{name}.log"

    def pid(self) -> int | None:
        """The recorded pid if that process is still alive (and not a zombie)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return None if stat.rsplit(")", 1)[-1].split()[0] == "Z" else pid

    def start(self, argv: Sequence[str], *, ready: Callable[[], bool], timeout: float = 10.0) -> int:
        """Spawn ``argv`` detached, record its pid, and wait until ``ready()`` is true.

        Raises:
            BackendUnavailable: The program is not installed.
            ProvisioningError: It exited or did not become ready in time (log tail attached).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            try:
                proc = subprocess.Popen(
                    list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
            except FileNotFoundError as exc:
                raise BackendUnavailable(f"{argv[0]} is not installed", program=argv[0]) from exc
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ProvisioningError(f"{self.name} exited with {proc.returncode}: {self.log_tail()}")
            if ready():
                return proc.pid
            time.sleep(0.02)
        self.stop()
        raise ProvisioningError(f"{self.name} did not become ready in {timeout:.0f} s: {self.log_tail()}")

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the recorded process (SIGTERM, then SIGKILL) and forget it."""
        pid = self.pid()
        if pid is not None:
            _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.pid() is not None and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.02)
            if self.pid() is not None:
                _signal(pid, signal.SIGKILL)
                time.sleep(0.05)
            _reap(pid)
        self.pid_file.unlink(missing_ok=True)

    def log_tail(self, n: int = 600) -> str:
        """The last ``n`` characters of the daemon's log."""
        try:
            return self.log_file.read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    # Our own child becomes a zombie until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
