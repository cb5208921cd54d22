"""The control block: step counters both sides poll, liveness, and the abort word.

A small shared int64 array: ``grad_step[w]`` (worker w's gradients for step k are in place
when it reads k+1), ``done_step[s]`` (shard s has published step k+1), ``published[i]``
(parameter slot i's update of step k is published: k+1), ``abort``, ``dead``
(which worker died, +1), ``taken`` (the last step whose PS state a checkpoint has copied) and
the launcher's pid: a worker or shard whose launcher is gone (killed) gives up instead of
waiting forever. Polling a few counters costs microseconds and works across any
process that maps the file; a side that waits longer than the step timeout fails the step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from carina.core.errors import CarinaError

__all__ = ["Control", "WorkerDied", "pid_watch"]

_ABORT, _DEAD, _TAKEN, _LAUNCHER, _HEADER = 0, 1, 2, 3, 4


class WorkerDied(CarinaError):
    """A worker process died mid-step; the PS state stays at the last completed step."""


class Control:
    """The shared counters of one job."""

    def __init__(self, path: Path, workers: int, shards: int, *, create: bool, slots: int = 0) -> None:
        import torch

        self.workers, self.shards, self.slots = workers, shards, slots
        n = _HEADER + workers + shards + slots
        if create:
            with path.open("wb") as fh:
                fh.truncate(8 * n)
        self.words = torch.from_file(str(path), shared=True, size=n, dtype=torch.int64)
        if create:
            self.words[_LAUNCHER] = os.getpid()
        self.launcher = int(self.words[_LAUNCHER])
        self._own = self.launcher == os.getpid()

    def grad_step(self, w: int) -> int:
        """The step whose gradients worker ``w`` has put in place."""
        return int(self.words[_HEADER + w])

    def set_grad_step(self, w: int, step: int) -> None:
        """Worker ``w`` announces its gradients for ``step`` - 1 are in place."""
        self.words[_HEADER + w] = step

    def done_step(self, s: int) -> int:
        """The step shard ``s`` has published."""
        return int(self.words[_HEADER + self.workers + s])

    def set_done_step(self, s: int, step: int) -> None:
        """Shard ``s`` announces it has published ``step``."""
        self.words[_HEADER + self.workers + s] = step

    def published(self, i: int) -> int:
        """The step whose update of parameter slot ``i`` is published."""
        return int(self.words[_HEADER + self.workers + self.shards + i])

    def set_published(self, i: int, step: int) -> None:
        """Slot ``i``'s update for ``step`` - 1 is published (its shard may still be updating others)."""
        self.words[_HEADER + self.workers + self.shards + i] = step

    @property
    def taken(self) -> int:
        """The last step whose PS state the checkpoint callback has copied."""
        return int(self.words[_TAKEN])

    def set_taken(self, step: int) -> None:
        """The launcher has copied the PS state of ``step``: shards may apply the next update."""
        self.words[_TAKEN] = step

    def abort(self, dead_worker: int) -> None:
        """Stop every side; record which worker died."""
        self.words[_DEAD] = dead_worker + 1
        self.words[_ABORT] = 1

    @property
    def aborted(self) -> bool:
        """Whether a side has abandoned the job."""
        return bool(int(self.words[_ABORT]))

    @property
    def dead_worker(self) -> int | None:
        """Index of the worker that died, if one did."""
        dead = int(self.words[_DEAD])
        return dead - 1 if dead else None

    def wait(
        self, ready: Callable[[], bool], *, timeout: float, what: str, alive: Callable[[], int | None] | None = None
    ) -> None:
        """Poll until ``ready()``; raise if aborted, a watched process died, or ``timeout`` passes.

        Args:
            ready: The condition to wait for.
            timeout: Seconds.
            what: Said in the error.
            alive: Returns the index of a dead worker, or None while all live.
        """
        deadline = time.monotonic() + timeout
        delay = 1e-5
        while not ready():
            if self.aborted:
                raise WorkerDied(
                    f"worker {self.dead_worker} died; step abandoned while waiting for {what}", worker=self.dead_worker
                )
            dead = alive() if alive is not None else None
            if dead is not None:
                self.abort(dead)
                continue
            if not self._own and not _alive(self.launcher):
                raise CarinaError(f"the launcher (pid {self.launcher}) died while waiting for {what}")
            if time.monotonic() > deadline:
                raise CarinaError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(delay)
            delay = min(delay * 2, 2e-3)


def pid_watch(pids: Sequence[int]) -> Callable[[], int | None]:
    """A liveness probe: the index of the first pid that no longer exists (or is a zombie)."""

    def probe() -> int | None:
        for index, pid in enumerate(pids):
            if not _alive(pid):
                return index
        return None

    return probe


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
