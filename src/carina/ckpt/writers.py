"""Writers: who persists a staged snapshot while training goes on.

=========  ==============================================================
``fork``   CRUM-style: fork a child that checksums the arena while its own
           forked grandchild writes it (O_DIRECT, fsync), then commits and
           ``_exit``\\ s (carina.ckpt.forkwrite.ForkWriter). Neither touches torch or CUDA.
``process`` a persistent spawned process reading a shared-memory arena;
           only (job, arena name) crosses the pipe (carina.ckpt.procwrite.ProcessWriter).
``thread`` a background thread in the trainer process.
``sync``   write before ``save()`` returns (the baseline).
=========  ==============================================================

Every writer runs :func:`carina.ckpt.commit.run_job`, one job at a time, in
submission order, and keeps a failed job's error until :meth:`Writer.check`
or :meth:`Writer.wait` raises it: a failed background write never goes unseen.
Each remembers when its recent steps became durable (:meth:`Writer.durable_at`,
``time.monotonic()``, one clock for every process of the machine): retention runs
after that point, and a job is done only once it has.
"""

from __future__ import annotations

import enum
import os
import pickle
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from carina.ckpt import commit
from carina.ckpt.commit import CommitJob, run_job
from carina.ckpt.timeline import Timeline
from carina.core.errors import CarinaError, CheckpointError

if TYPE_CHECKING:
    from carina.ckpt.staging import Snapshot

__all__ = [
    "SyncWriter",
    "ThreadWriter",
    "Writer",
    "WriterKind",
    "copy_error",
    "engine_writer",
    "renice",
    "timed_job",
    "unpickle_error",
]


class WriterKind(enum.Enum):
    """Which writer persists snapshots."""

    FORK = "fork"
    PROCESS = "process"
    THREAD = "thread"
    SYNC = "sync"


#: With a watermark (``engine_writer``'s ``ready``), the feeder writes pieces of at least this many bytes.
PIECE = 4 << 20
PIECE_ALIGN = 4096  # O_DIRECT: every piece but the file's last ends on a block

#: Steps whose durable time a writer remembers.
_REMEMBER = 64


class Writer(ABC):
    """Persists staged snapshots in order; remembers failures until checked."""

    kind: WriterKind

    def __init__(self, nice: int = 0) -> None:
        self._errors: list[BaseException] = []
        self._durable: dict[int, float] = {}
        self._timelines: dict[int, dict[str, Any]] = {}
        self.nice = nice  # added to the writer's own niceness where it runs apart from the trainer

    def durable_at(self, step: int) -> float | None:
        """When ``step`` became durable (``time.monotonic()``) if a recent job of this writer committed it."""
        self._busy()
        return self._durable.get(step)

    def timeline(self, step: int) -> dict[str, Any] | None:
        """How ``step`` was written (:meth:`carina.ckpt.timeline.Timeline.to_dict`) if a recent job kept one."""
        self._busy()
        return self._timelines.get(step)

    def _record(self, step: int, when: float, timeline: dict[str, Any] | None = None) -> None:
        self._durable[step] = when
        if timeline is not None:
            self._timelines[step] = timeline
        for kept in (self._durable, self._timelines):
            while len(kept) > _REMEMBER:
                del kept[next(iter(kept))]

    def submit(self, job: CommitJob, snap: Snapshot, handle: Any) -> None:
        """Queue ``job`` for the staged ``snap``; its arena must stay unchanged until done.

        A writer outside the trainer's CUDA context starts only once ``snap.ready()``.
        """
        self.check()
        self._submit(job, snap, handle)

    def busy(self) -> set[int]:
        """Arenas still being written (finished jobs are reaped first)."""
        return self._busy()

    def check(self) -> None:
        """Raise the first error of a finished job (once).

        Raises:
            CheckpointError: A background write failed (``DeviceFull`` when the disk filled).
        """
        self._busy()
        if self._errors:
            exc = self._errors.pop(0)
            self._errors.clear()
            if isinstance(exc, CarinaError):  # CheckpointError, DeviceFull, ...
                raise exc
            raise CheckpointError(f"background checkpoint write failed: {exc!r}") from exc

    def wait(self) -> None:
        """Block until every queued job is done, then :meth:`check`."""
        self._wait()
        self.check()

    def close(self) -> None:
        """Finish queued jobs and release resources (errors are raised)."""
        try:
            self.wait()
        finally:
            self._close()

    @abstractmethod
    def _submit(self, job: CommitJob, snap: Snapshot, handle: Any) -> None: ...

    @abstractmethod
    def _busy(self) -> set[int]: ...

    @abstractmethod
    def _wait(self) -> None: ...

    def _close(self) -> None:
        return None


def _engine() -> Any:
    from carina.io import Direct, IOConfig, IOEngine

    return IOEngine(IOConfig(direct=Direct.AUTO))


def engine_writer(
    engine: Any, ready: Callable[[int], int] | None = None, timeline: Timeline | None = None
) -> commit.Writer:
    """A :data:`Writer` that moves the bytes through a :class:`carina.io.IOEngine` (O_DIRECT when it can).

    Used by the thread, process and sync writers; the forked child keeps to its
    grandchild because it must not start threads. A feeder thread submits the
    chunks (it blocks whenever the engine's queue depth is full: a state larger than
    ``queue_depth x commit.CHUNK``), so the caller computes the checksums while the disk
    works from the first chunk to the last; the returned function waits for the
    feeder and the writes, and fsyncs. With ``ready`` (see :func:`carina.ckpt.commit.run_job`)
    the feeder writes only bytes it has declared final: pieces of at least :data:`PIECE` (or the
    rest), block-aligned, of at most ``commit.CHUNK``. A ``timeline`` gets the bytes submitted and
    written, the feeder's waits and the ``checksummed`` and ``fsynced`` phases.
    """
    tl = timeline if timeline is not None else Timeline()
    gate = ready if ready is None else tl.gate(ready, None, "feed_frontier")

    def write(path: str, data: memoryview) -> Callable[[], None]:
        handle = engine.open(path, "w", size=len(data))
        futures: list[Any] = []
        failed: list[BaseException] = []

        def feed() -> None:
            try:
                off = 0
                while off < len(data):
                    end = min(off + commit.CHUNK, len(data))
                    if gate is not None and end < len(data):  # the last piece may end unaligned
                        end = min(end, gate(min(off + PIECE, len(data))))
                        end = end if end == len(data) else end - end % PIECE_ALIGN
                    elif gate is not None:
                        gate(end)
                    start = time.monotonic()
                    fut = engine.write(handle, off, data[off:end])
                    tl.waited("feed_queue", time.monotonic() - start)
                    fut.add_done_callback(_counted(tl, end - off))
                    futures.append(fut)
                    tl.mark("submitted", end)
                    off = end
            except BaseException as exc:  # noqa: BLE001 - raised by finish() in the caller's thread
                failed.append(exc)

        feeder = threading.Thread(target=feed, name="carina-ckpt-feed", daemon=True)
        feeder.start()

        def finish() -> None:
            tl.phase("checksummed")  # run_job finishes once every checksum is computed
            try:
                feeder.join()
                for fut in futures:
                    fut.result()
                if failed:
                    raise failed[0]
                # A future wakes its waiters before it runs its callbacks: every byte is written by now
                # even where a completion has not been counted yet (a no-op where all were).
                tl.mark("written", len(data))
                commit.fault_phase("data_chunk")
                engine.fsync(handle)
                tl.phase("fsynced")
            finally:
                engine.close_file(handle)

        return finish

    return write


def timed_job(
    job: CommitJob, image: memoryview, engine: Any, ready: Callable[[int], int] | None = None,
    timeline: Timeline | None = None,
) -> tuple[float, dict[str, Any]]:  # fmt: skip
    """:func:`carina.ckpt.commit.run_job` through :func:`engine_writer`: (durable time, its timeline's record)."""
    tl = timeline if timeline is not None else Timeline()
    when = run_job(job, image, engine_writer(engine, ready, tl), tl.gate(ready, "checksummed", "crc_frontier"))
    tl.phase("durable", when)
    tl.phase("done")
    return when, tl.to_dict()


def _counted(timeline: Timeline, nbytes: int) -> Callable[[Any], None]:
    """A write's completion callback: its ``nbytes`` count as ``written`` if it succeeded."""

    def done(fut: Any) -> None:
        if fut.exception() is None:
            timeline.add("written", nbytes)

    return done


class SyncWriter(Writer):
    """Writes inside ``save()`` (in the trainer's thread: ``nice`` is not applied)."""

    kind = WriterKind.SYNC

    def __init__(self, nice: int = 0) -> None:
        super().__init__(nice)
        self._engine = _engine()

    def _submit(self, job: CommitJob, snap: Snapshot, handle: Any) -> None:
        tl = Timeline()
        snap.wait()
        tl.phase("copies_done")
        self._record(job.step, *timed_job(job, snap.view(), self._engine, timeline=tl))

    def _close(self) -> None:
        self._engine.close()

    def _busy(self) -> set[int]:
        return set()

    def _wait(self) -> None:
        return None


class ThreadWriter(Writer):
    """One background thread working through a queue."""

    kind = WriterKind.THREAD

    def __init__(self, nice: int = 0) -> None:
        super().__init__(nice)
        self._queue: queue.Queue[tuple[CommitJob, Snapshot] | None] = queue.Queue()
        self._inflight: dict[int, int] = {}
        self._lock = threading.Lock()
        self._engine = _engine()
        self._thread = threading.Thread(target=self._run, name="carina-ckpt-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        renice(self.nice, threading.get_native_id())  # Linux: a thread's id names it alone
        while (item := self._queue.get()) is not None:
            job, snap = item
            arena = snap.arena
            try:
                tl = Timeline()
                snap.wait()
                tl.phase("copies_done")
                when, record = timed_job(job, snap.view(), self._engine, timeline=tl)
                with self._lock:
                    self._record(job.step, when, record)
            except BaseException as exc:  # noqa: BLE001 - kept and raised at the next check()
                with self._lock:
                    self._errors.append(exc)
            finally:
                with self._lock:
                    self._inflight[arena] -= 1
                self._queue.task_done()
        self._queue.task_done()

    def _submit(self, job: CommitJob, snap: Snapshot, handle: Any) -> None:
        with self._lock:
            self._inflight[snap.arena] = self._inflight.get(snap.arena, 0) + 1
        self._queue.put((job, snap))

    def _busy(self) -> set[int]:
        with self._lock:
            return {a for a, n in self._inflight.items() if n}

    def _wait(self) -> None:
        self._queue.join()

    def _close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._engine.close()


def copy_error(cause: BaseException) -> CheckpointError:
    """The error a snapshot whose lent host copy failed is reported with (its cause chained)."""
    exc = CheckpointError(f"snapshot copy failed: {cause!r}")
    exc.__cause__ = cause
    return exc


def unpickle_error(message: bytes, step: int | None) -> BaseException:
    """The error a writer process sent: a pickled exception, or its text."""
    try:
        exc = pickle.loads(message)
    except Exception:  # noqa: BLE001 - not a pickle: the child sent text
        return CheckpointError(f"writer failed: {message.decode(errors='replace')}", key=f"step {step}")
    return exc if isinstance(exc, BaseException) else CheckpointError(str(exc))


def renice(nice: int, who: int) -> None:
    """Add ``nice`` to the niceness of process or (Linux) thread ``who`` (0: the caller); never fatal."""
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, who, min(19, os.getpriority(os.PRIO_PROCESS, who) + nice))
        except OSError:
            pass  # not permitted here: the writer runs at the trainer's priority
