"""The engine: open files, submit reads and writes, get futures back.

from carina.io import IOEngine, IOConfig, aligned_buffer

with IOEngine(IOConfig(backend="auto", queue_depth=64)) as eng:
    h = eng.open("data.bin", "r")
    buf = aligned_buffer(1 << 20)
    eng.read(h, 0, buf).result()         # bytes read
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from carina.core.backend import Selection
from carina.core.errors import ConfigError, IOEngineError
from carina.io._buffers import byte_view, is_cuda_tensor
from carina.io._coalesce import plan_runs
from carina.io._config import IOConfig
from carina.io._future import IOFuture, Op, OpKind, Request, in_completion_context
from carina.io._gather import GatherOp
from carina.io._handle import FileHandle, Mode, open_handle
from carina.io._transfer import Member, Transfer
from carina.io.backends import IOBackend, build_backend

__all__ = ["IOEngine"]

Job = tuple[FileHandle, int, Any]


class IOEngine:
    """Asynchronous, batched reads and writes of files into caller memory.

    Args:
        config: Settings; the defaults pick the best backend available here.
        backend: A backend instance to use instead of ``config.backend``
            (e.g. the scripted mock of :mod:`carina.testing.io`).

    Attributes:
        config: The settings in use.
        backend: The running backend; ``selection.explain()`` says why it was chosen.
    """

    Config = IOConfig  # ``IOEngine.Config`` (the spelling) is the same class

    def __init__(self, config: IOConfig | None = None, *, backend: IOBackend | None = None) -> None:
        self.config = config or IOConfig()
        if backend is not None:
            self.backend: IOBackend = backend
            self.selection: Selection[Any] | None = None
        else:
            self.backend, self.selection = build_backend(
                self.config.backend, queue_depth=self.config.queue_depth, workers=self.config.workers
            )
        self._slots = threading.Condition()
        self._inflight = 0
        self._handles: set[FileHandle] = set()
        self._closed = False
        self._staging: Any = None
        self._retired: list[Any] = []  # replaced arenas, kept alive (registered memory, blocks in use)
        self._arena_lock = threading.Lock()
        self.stats = {"requests": 0, "ops": 0, "bytes": 0, "bounced": 0, "merged": 0, "peak_inflight": 0}

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> IOEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Wait for work in flight, stop the backend, close every file (idempotent)."""
        if self._closed:
            return
        self.drain()
        self._closed = True
        self.backend.close()
        for h in list(self._handles):
            h.release()
        self._handles.clear()

    def drain(self, timeout: float | None = None) -> None:
        """Block until every operation submitted so far has completed.

        Raises:
            IOEngineError: Called from a completion callback (it would deadlock),
                or ``timeout`` passed first.
        """
        if in_completion_context():
            raise IOEngineError("drain() or close() inside a completion callback would deadlock")
        with self._slots:
            if not self._slots.wait_for(lambda: self._inflight == 0, timeout):
                raise IOEngineError(f"drain timed out with {self._inflight} operations in flight")

    # -- files ----------------------------------------------------------------
    def open(self, path: str | os.PathLike[str], mode: Mode = "r", size: int | None = None) -> FileHandle:
        """Open ``path`` (``r``, ``w`` or ``rw``); O_DIRECT per ``config.direct``."""
        self._check_open()
        h = open_handle(path, mode, size=size, direct=self.config.direct, alignment=self.config.alignment)
        self._handles.add(h)
        return h

    def fsync(self, handle: FileHandle) -> None:
        """Wait for the handle's operations, then flush its data to the device."""
        self._check_handle(handle)
        handle.wait_idle()
        try:
            os.fsync(handle.fd)
        except OSError as exc:
            raise IOEngineError(f"fsync failed: {exc.strerror}", path=str(handle.path)) from exc

    def close_file(self, handle: FileHandle) -> None:
        """Wait for the handle's operations, then close it (idempotent)."""
        if handle.closed:
            return
        handle.wait_idle()
        handle.release()
        self._handles.discard(handle)

    # -- single requests --------------------------------------------------------
    def read(self, handle: FileHandle, offset: int, buf: Any) -> IOFuture:
        """Read ``len(buf)`` bytes at ``offset`` into ``buf``; a CUDA tensor goes through staging."""
        if is_cuda_tensor(buf):
            return self.read_staged(handle, offset, buf)
        return self.read_batch([(handle, offset, buf)], coalesce=False)[0]

    def write(self, handle: FileHandle, offset: int, buf: Any) -> IOFuture:
        """Write all of ``buf`` at ``offset``; a CUDA tensor goes through staging."""
        if is_cuda_tensor(buf):
            return self.write_staged(handle, offset, buf)
        return self.write_batch([(handle, offset, buf)], coalesce=False)[0]

    # -- batches --------------------------------------------------------------------
    def read_batch(self, jobs: Iterable[Job], *, coalesce: bool = True) -> list[IOFuture]:
        """Read many ``(handle, offset, buf)`` at once; duplicates are read once, neighbours merged.

        Returns:
            One future per job, in the order given.
        """
        return self._batch(OpKind.READ, list(jobs), coalesce)

    def write_batch(self, jobs: Iterable[Job], *, coalesce: bool = True) -> list[IOFuture]:
        """Write many ``(handle, offset, buf)`` at once; exactly adjacent ones are merged."""
        return self._batch(OpKind.WRITE, list(jobs), coalesce)

    def _batch(self, kind: OpKind, jobs: list[Job], coalesce: bool) -> list[IOFuture]:
        self._check_open()
        members = [self._member(kind, *job) for job in jobs]
        runs = (
            self._runs(kind, jobs, members) if coalesce else [(j[0], [m]) for j, m in zip(jobs, members, strict=False)]
        )
        self.stats["requests"] += len(members)
        ops: list[Op] = []
        for handle, group in runs:
            if not self._acquire(block=False):
                self._submit_ops(ops)  # submit what is ready before waiting for a slot
                ops = []
                self._acquire(block=True)
            op = self._start(kind, handle, group)
            if op is not None:
                ops.append(op)
        self._submit_ops(ops)
        return [m.future for m in members]

    def _runs(self, kind: OpKind, jobs: list[Job], members: list[Member]) -> list[tuple[FileHandle, list[Member]]]:
        gap = self.config.coalesce_gap if kind is OpKind.READ else 0
        keys = [(id(h), off, m.view.nbytes) for (h, off, _), m in zip(jobs, members, strict=True)]
        if kind is OpKind.WRITE and len(set(keys)) != len(keys):
            raise ConfigError("write_batch got the same range twice", key="jobs")
        out = []
        for run in plan_runs(keys, gap=gap, max_bytes=self.config.max_coalesce):
            group = [members[i] for i in run.members]
            for m, dup in zip(group, run.copies, strict=True):
                m.copies = [(members[j].view, members[j].future) for j in dup]
            self.stats["merged"] += len(group) - 1
            out.append((jobs[run.members[0]][0], group))
        return out

    def _member(self, kind: OpKind, handle: FileHandle, offset: int, buf: Any) -> Member:
        self._check_handle(handle)
        if kind is OpKind.WRITE and not handle.writable:
            raise IOEngineError("file was opened read-only", path=str(handle.path), offset=offset)
        if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
            raise ConfigError(f"offset must be a non-negative integer, not {offset!r}", key="offset")
        view = byte_view(buf, writable=kind is OpKind.READ)
        request = Request(kind, str(handle.path), int(offset), view.nbytes)
        return Member(offset=int(offset), view=view, future=IOFuture(request))

    def _start(self, kind: OpKind, handle: FileHandle, members: list[Member]) -> Op | None:
        handle.begin()
        transfer = Transfer(
            kind,
            handle,
            members,
            policy=self.config.direct,
            submit=self._submit_op,
            release=self._release,
            bounce=self._bounce,
        )
        self.stats["bytes"] += transfer.nbytes
        return transfer.start()

    def gather(self, handle: FileHandle, offsets: Any, nbytes: Any, dest: Any, *, coalesce: bool = True) -> IOFuture:
        """Read many rows of one file into ``dest``, packed in order, behind one future.

        Args:
            handle: The file.
            offsets: 1-D integer array of file offsets, one per row.
            nbytes: Row size (an int), or a 1-D array of sizes like ``offsets``.
            dest: Writable CPU buffer of at least ``sum(nbytes)`` bytes.
            coalesce: Merge rows adjacent in the file into one read (``False``: one
                read per row, as a caller that sized its reads itself wants).

        Returns:
            A future of the total bytes; a failed or short row fails it, naming
            the first such row's offset.
        """
        from carina.io._gather import gather

        return gather(self, handle, offsets, nbytes, dest, coalesce=coalesce)

    def _run_gather(self, handle: FileHandle, op: GatherOp) -> None:
        self._acquire(block=True)
        handle.begin()
        self.stats["ops"] += len(op.offsets)
        self.stats["bytes"] += int(op.lengths.sum())
        self.backend.submit_gather(op)

    def _gather_done(self, handle: FileHandle) -> None:
        self._release_slot(handle)

    # -- plumbing ---------------------------------------------------------------------
    def _submit_op(self, op: Op) -> None:
        self._submit_ops([op])

    def _submit_ops(self, ops: list[Op]) -> None:
        with self._slots:
            self.stats["ops"] += len(ops)
        self.backend.submit(ops)

    def staging_arena(self, *, replace: bool = False) -> Any:
        """The engine's :class:`~carina.io._staging.StagingArena` (``bounce_bytes``), made on first use.

        It holds bounce buffers of misaligned ``O_DIRECT`` requests and staging
        for GPU tensors, and is offered to the backend as registered memory.
        ``replace`` makes a new one (the old one is kept alive).
        """
        from carina.io._staging import StagingArena

        with self._arena_lock:
            if self._staging is None or replace:
                if self._staging is not None:
                    self._retired.append(self._staging)
                arena = StagingArena(self.config.bounce_bytes, self.config.alignment)
                if arena.capacity:
                    arena.registered = self.backend.register_memory(arena.address, arena.capacity)
                self._staging = arena
            return self._staging

    def _bounce(self, nbytes: int) -> tuple[np.ndarray, Callable[[], None]]:
        """An aligned buffer from the staging arena (a one-off when it is full) and its release."""
        self.stats["bounced"] += 1
        arena = self.staging_arena()
        buf, block = arena.alloc_array(nbytes)
        return buf, lambda: arena.free(block)

    def _acquire(self, *, block: bool) -> bool:
        """Take a slot of the queue depth; never blocks a backend thread (it may overcommit)."""
        with self._slots:
            if self._inflight >= self.config.queue_depth and not in_completion_context():
                if not block:
                    return False
                self._slots.wait_for(lambda: self._inflight < self.config.queue_depth)
            self._inflight += 1
            self.stats["peak_inflight"] = max(self.stats["peak_inflight"], self._inflight)
            return True

    def _release(self, transfer: Transfer) -> None:
        self._release_slot(transfer.handle)

    def _release_slot(self, handle: FileHandle) -> None:
        handle.end()
        with self._slots:
            self._inflight -= 1
            self._slots.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise IOEngineError("the engine is closed; it accepts no new work")

    def _check_handle(self, handle: FileHandle) -> None:
        self._check_open()
        if not isinstance(handle, FileHandle):
            raise ConfigError(f"expected a FileHandle from IOEngine.open, not {type(handle).__name__}", key="handle")
        if handle.closed:
            raise IOEngineError("file is closed", path=str(handle.path))

    # -- GPU destinations (see _staging) ------------------------------------------------
    def read_staged(self, handle: FileHandle, offset: int, tensor: Any) -> IOFuture:
        """Read into ``tensor`` through pinned staging and a copy stream (works for CPU tensors too)."""
        from carina.io._staging import staged_read

        return staged_read(self, handle, offset, tensor)

    def write_staged(self, handle: FileHandle, offset: int, tensor: Any) -> IOFuture:
        """Write ``tensor`` via a pinned staging copy (works for CPU tensors too)."""
        from carina.io._staging import staged_write

        return staged_write(self, handle, offset, tensor)
