"""The ``process`` payload engine: worker processes that map the engine's arena.

Each worker maps the same arena file (shared memory, no payload copies over
pipes) and runs the job lists it is sent; only (batch id, jobs) and the results
cross its pipe. Pieces go to the least busy worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import signal
from typing import Any

from carina.core.errors import BackendUnavailable, IOEngineError
from carina.infra.storage.codecs import Job, Result, run_jobs
from carina.infra.storage.config import Overflow
from carina.infra.storage.enginebase import Arena, PayloadEngine, _Done

__all__ = ["ProcessEngine"]


def _worker_main(conn: Any, path: str, nbytes: int) -> None:
    """Worker process: map the arena, then run job batches until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, nbytes)
    os.close(fd)
    view = memoryview(mm)
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        batch_id, jobs = msg
        try:
            conn.send((batch_id, run_jobs(view, jobs)))
        except Exception as exc:  # noqa: BLE001 - report to the parent, keep serving
            conn.send((batch_id, IOEngineError(f"codec worker failed: {exc!r}")))


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
        self._conns[worker].send((batch_id, jobs))

    def _on_reply(self, worker: int) -> None:
        conn = self._conns[worker]
        try:
            while True:  # drain every reply that is ready, so a worker never blocks on a full pipe
                self._deliver(worker, *conn.recv())
                if not conn.poll():
                    break
        except (EOFError, OSError) as exc:
            self._fail_all(IOEngineError(f"codec worker {worker} died: {exc!r}"))

    def _deliver(self, worker: int, batch_id: int, out: list[Result] | BaseException) -> None:
        count, done = self._waiting.pop(batch_id)
        self._outstanding[worker] -= count
        done(out)

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
                conn.send(None)
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._conns = []
        super().close()
