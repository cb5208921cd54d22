"""The ``process`` payload engine: worker processes that map the engine's arena.

Each worker maps the same arena file (shared memory, no payload copies over
pipes) and runs the job lists it is sent; only (batch id, jobs) and the results
cross its channel, packed as int64 arrays (:func:`pack_jobs`, :func:`pack_results`):
one ``write`` per piece each way and one ``read`` per wake-up, no pickling (session 11:
``multiprocessing``'s pickled messages cost the front end two reads, a poll and a
pickle per reply). Pieces go to the least busy worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import signal
import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any

from carina.core.errors import BackendUnavailable, IOEngineError
from carina.infra.storage.codecs import Job, Result, run_jobs
from carina.infra.storage.config import Overflow
from carina.infra.storage.enginebase import Arena, PayloadEngine, _Done

__all__ = ["ProcessEngine"]


_HEAD = struct.Struct("<qi")  # batch id; job count (to a worker) or result count, < 0: error text length
_STOP = _HEAD.pack(-1, 0)


def pack_jobs(batch_id: int, jobs: Sequence[Job]) -> bytes:
    """One message to a worker: header, then seven little-endian int64 per job (no pickling)."""
    return _HEAD.pack(batch_id, len(jobs)) + struct.pack(f"<{7 * len(jobs)}q", *chain.from_iterable(jobs))


def pack_results(batch_id: int, out: list[Result] | BaseException) -> bytes:
    """One message back: header, then three int64 per result, or the error's text."""
    if isinstance(out, BaseException):
        text = repr(out).encode()[:4096]
        return _HEAD.pack(batch_id, -len(text) - 1) + text
    return _HEAD.pack(batch_id, len(out)) + struct.pack(f"<{3 * len(out)}q", *chain.from_iterable(out))


class _Frames:
    """Reassembles whole messages from what one ``os.read`` returned (a message may span reads)."""

    def __init__(self, width: int) -> None:
        self.buf = bytearray()
        self.width = width  # int64 per item: 7 (jobs) or 3 (results)

    def feed(self, data: bytes) -> list[tuple[int, list[tuple[int, ...]] | str]]:
        """Add ``data``; return the messages it completed: ``(batch_id, items)`` or ``(batch_id, error text)``."""
        self.buf += data
        out: list[tuple[int, list[tuple[int, ...]] | str]] = []
        pos, size = 0, _HEAD.size
        while len(self.buf) - pos >= size:
            batch_id, n = _HEAD.unpack_from(self.buf, pos)
            body = -n - 1 if n < 0 else 8 * self.width * n
            if len(self.buf) - pos - size < body:
                break
            start = pos + size
            if n < 0:
                out.append((batch_id, bytes(self.buf[start : start + body]).decode(errors="replace")))
            else:
                flat = struct.unpack_from(f"<{self.width * n}q", self.buf, start)
                w = self.width
                out.append((batch_id, [flat[i : i + w] for i in range(0, w * n, w)]))
            pos = start + body
        del self.buf[:pos]
        return out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _worker_main(conn: Any, path: str, nbytes: int) -> None:
    """Worker process: map the arena, then run job messages until the channel closes or says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, nbytes)
    os.close(fd)
    view = memoryview(mm)
    conn.send("ready")
    chan, frames = conn.fileno(), _Frames(7)
    while True:
        try:
            data = os.read(chan, 1 << 18)
        except OSError:
            break
        if not data:
            break
        for batch_id, jobs in frames.feed(data):
            if batch_id < 0:
                return
            try:
                out: list[Result] | BaseException = run_jobs(view, jobs)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - report to the parent, keep serving
                out = exc
            try:
                _write_all(chan, pack_results(batch_id, out))
            except OSError:
                return


class ProcessEngine(PayloadEngine):
    """A pool of worker processes that map the arena; each piece goes to the least busy worker."""

    name = "process"
    # job and result messages stay far below a socket buffer, so a blocking send to a busy worker cannot
    # wait on a worker that is itself blocked sending results back
    max_piece_jobs = 1024

    def __init__(
        self, arena_bytes: int, *, workers: int = 2, max_inflight: int = 0, overflow: Overflow = Overflow.QUEUE
    ) -> None:
        import multiprocessing as mp

        super().__init__(Arena(arena_bytes, shared=True), max_inflight=max_inflight, overflow=overflow)
        ctx = mp.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        try:
            for _ in range(workers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(child, str(self.arena.path), arena_bytes), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            for conn in self._conns:
                if not conn.poll(60) or conn.recv() != "ready":
                    raise BackendUnavailable("a codec worker process did not start")
        except BaseException:
            self.close()
            raise
        finally:
            self.arena.unlink()
        self._next_id = 0
        self._waiting: dict[int, tuple[int, _Done]] = {}
        self._outstanding = [0] * workers
        self._frames = [_Frames(3) for _ in range(workers)]
        self.pieces = workers

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers."""
        return [p.pid for p in self._procs]

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        for i, conn in enumerate(self._conns):
            loop.add_reader(conn.fileno(), self._on_reply, i)
            # uvloop makes a watched fd non-blocking: a reply larger than the socket buffer (a batch of many
            # requests) would then end in EAGAIN halfway through recv(); readiness is all the loop needs
            os.set_blocking(conn.fileno(), True)

    def _launch(self, jobs: list[Job], done: _Done) -> None:
        self._attach()
        worker = min(range(len(self._conns)), key=self._outstanding.__getitem__)
        batch_id = self._next_id
        self._next_id += 1
        self._waiting[batch_id] = (len(jobs), done)
        self._outstanding[worker] += len(jobs)
        _write_all(self._conns[worker].fileno(), pack_jobs(batch_id, jobs))

    def _on_reply(self, worker: int) -> None:
        try:  # one read per wake-up takes every reply that is ready, so a worker never blocks on a full channel
            data = os.read(self._conns[worker].fileno(), 1 << 18)
        except OSError as exc:
            data, why = b"", repr(exc)
        else:
            why = "closed its channel"
        if not data:
            self._fail_all(IOEngineError(f"codec worker {worker} died: {why}", pid=self._procs[worker].pid))
            return
        for batch_id, out in self._frames[worker].feed(data):
            count, done = self._waiting.pop(batch_id)
            self._outstanding[worker] -= count
            if isinstance(out, str):
                done(IOEngineError(f"codec worker failed: {out}", pid=self._procs[worker].pid))
            else:
                done(out)  # type: ignore[arg-type]

    def _fail_all(self, exc: BaseException) -> None:
        if self._loop is not None:
            for conn in self._conns:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(conn.fileno())
        waiting, self._waiting = self._waiting, {}
        for _, done in waiting.values():
            done(exc)

    def close(self) -> None:
        """Tell workers to stop, join them, unmap the arena."""
        if self._loop is not None and not self._loop.is_closed():
            for conn in self._conns:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(conn.fileno())
        for conn in self._conns:
            with contextlib.suppress(Exception):
                _write_all(conn.fileno(), _STOP)
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._conns = []
        super().close()
