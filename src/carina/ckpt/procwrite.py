"""The ``process`` writer: a persistent spawned process persisting shared-memory arenas.

Only ``(job, arena name, arena, seq)`` crosses the pipe (the arena is a
:class:`carina.ckpt.shm.SharedArena`). A snapshot is sent once every byte but its lent slots' is in
host memory: while the lent host copies (:mod:`carina.ckpt.hostcopy`) still run behind training,
the writer process writes and checksums the image up to the copied-prefix watermark the trainer
publishes (:mod:`carina.ckpt.progress`), so copying and writing overlap. The commit still follows
only once every byte is written, fsynced and checksummed; a failed copy fails the job (nothing
commits) and is raised at the next ``save()``/``wait()``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from carina.ckpt.commit import CommitJob
from carina.ckpt.progress import ENTRIES, Progress
from carina.ckpt.timeline import Timeline
from carina.ckpt.writers import Writer, WriterKind, _engine, copy_error, renice, timed_job, unpickle_error
from carina.core.errors import CheckpointError

if TYPE_CHECKING:
    from carina.ckpt.staging import Snapshot

__all__ = ["ProcessWriter"]


class ProcessWriter(Writer):
    """A persistent spawned process writing from shared-memory arenas (see :mod:`carina.ckpt.shm`)."""

    kind = WriterKind.PROCESS

    def __init__(self, nice: int = 0) -> None:
        import multiprocessing as mp

        super().__init__(nice)
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.progress = Progress(ctx)  # the lent copies' watermarks, by arena
        self._proc = ctx.Process(
            target=_process_main, args=(child_conn, nice, self.progress, os.getpid()), name="carina-ckpt-writer",
            daemon=True,
        )  # fmt: skip
        self._proc.start()
        child_conn.close()
        self._seq = itertools.count(1)
        self._inflight: deque[tuple[int, int, Snapshot]] = deque()  # (arena, step, snapshot)
        self._pending: deque[tuple[CommitJob, Snapshot, Any]] = deque()
        self._copying: list[Snapshot] = []  # written (or failed) while their lent copies still run
        self._lock = threading.Lock()  # the pipe and queues: a snapshot's copy thread pumps too (on_ready)

    def _submit(self, job: CommitJob, snap: Snapshot, handle: Any) -> None:
        if not self._proc.is_alive():
            raise CheckpointError(f"writer process died (exit code {self._proc.exitcode})", key=f"step {job.step}")
        with self._lock:
            self._pending.append((job, snap, handle))
        self._pump()
        snap.on_ready(self._pump)  # lent host copies finishing behind training start the write at once
        if snap.lazy is not None and not snap.unlent_ready():  # on a GPU: stream once the D2H copies end,
            snap.lazy.watch(lambda _prefix, _failed: self._pump())  # checked as each lent slot is copied

    def _pump(self, block: bool = False) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                job, snap, handle = self._pending[0]
                streams = snap.lazy is not None and snap.arena < ENTRIES and snap.unlent_ready()
                if snap.ready() or streams:
                    self._pending.popleft()
                    self._send(job, snap, handle)
                    continue
            if not block:
                return
            with contextlib.suppress(CheckpointError):  # a failed copy: _send records it, the job is dropped
                snap.wait()  # outside the lock: the copy thread's own pump must get in

    def _send(self, job: CommitJob, snap: Snapshot, handle: Any) -> None:
        """Hand ``snap`` to the writer process (holding the lock): streamed while its lent copies run."""
        lazy = snap.lazy
        if lazy is not None and lazy.error is not None:
            self._errors.append(copy_error(lazy.error))  # never written: its bytes are not the step's
            return
        seq = None
        if lazy is not None and not lazy.done():
            seq, arena = next(self._seq), snap.arena
            self.progress.reset(arena, seq, snap.frontier(0))
            lazy.watch(lambda prefix, failed: self.progress.publish(arena, seq, snap.frontier(prefix), failed))
        self._conn.send((job, handle.name, snap.arena, seq))
        self._inflight.append((snap.arena, job.step, snap))

    def _collect(self, block: bool) -> None:
        while True:
            with self._lock:
                if not self._inflight or not self._conn.poll(0.05 if block else 0):
                    if not self._inflight or not block:
                        return
                    continue
                try:
                    _arena, error, when, timeline = self._conn.recv()
                except (EOFError, OSError):
                    self._errors.append(CheckpointError(f"writer process died (exit code {self._proc.exitcode})"))
                    self._inflight.clear()
                    return
                _, step, snap = self._inflight.popleft()
                if snap.lazy is not None and not snap.lazy.done():
                    self._copying.append(snap)  # its arena stays busy until the copy thread leaves it
                if error is not None:
                    cause = snap.lazy.error if snap.lazy is not None else None
                    self._errors.append(copy_error(cause) if cause else unpickle_error(error, step=step))
                else:
                    self._record(step, when, timeline)

    def _busy(self) -> set[int]:
        self._pump()
        self._collect(block=False)
        with self._lock:
            self._copying = [s for s in self._copying if s.lazy is not None and not s.lazy.done()]
            busy = {a for a, _, _ in self._inflight} | {snap.arena for _, snap, _ in self._pending}
            return busy | {s.arena for s in self._copying}

    def _wait(self) -> None:
        self._pump(block=True)
        self._collect(block=True)

    def _close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(None)
            self._proc.join(timeout=30)
        self._conn.close()


def _process_main(conn: Any, nice: int = 0, progress: Progress | None = None, parent: int = 0) -> None:
    from carina.ckpt.shm import attach

    renice(nice, 0)
    attached: dict[str, Any] = {}
    engine = _engine()
    while (msg := conn.recv()) is not None:
        job, name, arena, seq = msg
        error, when, timeline = None, 0.0, Timeline()
        try:
            if name not in attached:
                attached[name] = attach(name)
            ready = None if seq is None or progress is None else progress.gate(arena, seq, parent)
            when, record = timed_job(job, memoryview(attached[name].buf), engine, ready, timeline)
        except BaseException as exc:  # noqa: BLE001 - sent back to the trainer
            error, record = pickle.dumps(exc), None
        conn.send((arena, error, when, record))
    engine.close()
    for shm in attached.values():
        shm.close()
