"""What every payload engine is made of: the :class:`Arena` and the :class:`PayloadEngine` base.

The engines themselves, and :func:`~carina.infra.storage.engines.build_engine`
that picks one, stand above this module (see :mod:`carina.infra.storage.engines`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import mmap
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from carina.core.backend import Backend
from carina.core.errors import BackendUnavailable
from carina.infra.storage.codecs import Codec, Job, Op, Result, codec_available, run_jobs
from carina.infra.storage.config import Overflow

__all__ = ["Arena", "PayloadEngine"]

_Done = Callable[[list[Result] | BaseException], None]


class Arena:
    """A flat byte buffer, optionally backed by a file in ``/dev/shm`` that workers map.

    Args:
        nbytes: Size of the arena.
        shared: Back it by a shared-memory file (for worker processes).
    """

    def __init__(self, nbytes: int, *, shared: bool = False) -> None:
        self.nbytes = nbytes
        self.path: Path | None = None
        if shared:
            folder = "/dev/shm" if Path("/dev/shm").is_dir() else None
            fd, name = tempfile.mkstemp(prefix="carina-arena-", dir=folder)
            try:
                os.ftruncate(fd, nbytes)
                self._mm = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
            self.path = Path(name)
        else:
            self._mm = mmap.mmap(-1, nbytes)
        self.view = memoryview(self._mm)

    def unlink(self) -> None:
        """Remove the shared file (mappings stay valid); safe to call twice."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def close(self) -> None:
        """Unmap the arena; views into it must be gone."""
        self.unlink()
        self.view.release()
        with contextlib.suppress(BufferError):
            self._mm.close()


class PayloadEngine(Backend):
    """Base of payload engines: coalesces submitted jobs and hands batches to ``_launch``."""

    name = "?"
    #: Pieces one loop turn's jobs are cut into (one per worker for the CPU pools, one launch for a GPU).
    pieces = 1
    #: Fewest jobs worth a piece of their own.
    min_jobs = 1
    #: Fewest payload bytes worth a piece of their own (a GPU launch sequence costs the same for 4 KiB or 4 MiB).
    min_piece_bytes = 0
    #: Most jobs in one piece (0: no limit); longer pieces are cut, keeping each message to a worker small.
    max_piece_jobs = 0
    #: A request whose jobs all decompress blocks smaller than this (or blocks stored raw) runs right here,
    #: in the event loop (0: never); set for the CPU pools from ``EngineConfig.loop_below``.
    loop_below = 0
    #: Whether :meth:`run` never waits (jobs run in the caller's thread before it returns): the tier then
    #: serves requests that need no other wait without a coroutine, through :meth:`run_now`.
    runs_inline = False
    #: How the GPU engines' launch threads wait (set by ``build_engine``; "" for the CPU engines).
    cuda_wait_note = ""

    def __init__(self, arena: Arena, *, max_inflight: int = 0, overflow: Overflow = Overflow.QUEUE) -> None:
        self.arena = arena
        #: Most pieces in flight at once (0: no limit). While that many run, jobs submitted meanwhile (from
        #: every connection) wait here and leave together as the next batch, the moment a piece comes back.
        self.max_inflight = max_inflight
        #: ``LOOP``: jobs that no idle worker takes run in the event loop's own thread (see :meth:`_flush`).
        self.overflow = overflow
        #: Pieces the event loop ran itself (``Overflow.LOOP``).
        self.loop_pieces = 0
        self._inflight = 0
        self._pending: list[tuple[asyncio.Future[list[Result]], list[Job]]] = []
        self._scheduled = False
        self.batches = 0
        self.jobs = 0
        #: Seconds :meth:`prepare` took, and the ``(block_size, codec)`` it prepared for (``None``: never run).
        self.prepare_s = 0.0
        self.prepared_for: tuple[int, Codec] | None = None

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Reasons this engine cannot run codec ``request`` (a :class:`Codec`) here."""
        if isinstance(request, Codec):
            reason = codec_available(request)
            return [reason] if reason else []
        return []

    async def run(self, jobs: Sequence[Job]) -> list[Result]:
        """Run ``jobs`` (in one batch with any others submitted this loop turn)."""
        if not jobs:
            return []
        if self.loop_below and all(_cheap(job, self.loop_below) for job in jobs):
            self.loop_pieces += 1
            return run_jobs(self.arena.view, jobs)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Result]] = loop.create_future()
        self._pending.append((fut, list(jobs)))
        self._schedule(loop)
        return await fut

    def run_now(self, jobs: Sequence[Job]) -> list[Result]:
        """Run ``jobs`` here and now (only engines with :attr:`runs_inline` support it).

        Raises:
            BackendUnavailable: This engine hands its jobs off.
        """
        raise BackendUnavailable(f"the {self.name} engine does not run jobs inline")

    def _room(self) -> int:
        """Pieces that may be launched now (with ``Overflow.LOOP``: workers idle now)."""
        room = self.pieces if self.max_inflight <= 0 else min(self.pieces, self.max_inflight - self._inflight)
        return min(room, self.pieces - self._inflight) if self.overflow == Overflow.LOOP else room

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Flush the pending jobs at the end of this loop turn, unless every piece allowed is in flight."""
        if self._pending and not self._scheduled and (self._room() > 0 or self.overflow == Overflow.LOOP):
            self._scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Launch this loop turn's jobs as up to :attr:`pieces` pieces; each request completes with its pieces.

        A request does not wait for pieces it has no jobs in, so a worker that
        finishes early hands its requests back (and their next jobs arrive)
        while the others are still busy: batches overlap instead of running in
        lockstep.

        With ``Overflow.LOOP`` only idle workers get a piece, and the event
        loop runs one more piece itself, right here: what no worker is free
        for (everything, when all are busy). On a machine with as many cores
        as the pool has threads plus one, that keeps one runnable thread per
        core, and the loop's piece costs no handoff and finds its payloads in
        the cache of the core that just received them.
        """
        self._scheduled = False
        room = max(self._room(), 0)
        here = 1 if self.overflow == Overflow.LOOP else 0
        if not self._pending or room + here <= 0:
            return
        pending, self._pending = self._pending, []
        flat = [job for _, jobs in pending for job in jobs]
        self.batches += 1
        self.jobs += len(flat)
        spans, pos = [], 0
        for fut, jobs in pending:
            spans.append((fut, pos, pos + len(jobs)))
            pos += len(jobs)
        results: list[Result] = [(0, 0, 0)] * len(flat)
        block = max(flat[0][3] if flat[0][0] == 0 else flat[0][5], 1)
        pieces = _split(len(flat), room + here, max(self.min_jobs, self.min_piece_bytes // block))
        if self.max_piece_jobs:
            cap = self.max_piece_jobs
            pieces = [(lo, min(lo + cap, b)) for a, b in pieces for lo in range(a, b, cap)]
        waits = [sum(1 for a, b in pieces if a < stop and start < b) for _, start, stop in spans]
        for k, (a, b) in enumerate(pieces):  # the workers' pieces first, so they run while the loop runs its own
            members = [i for i, (_, start, stop) in enumerate(spans) if a < stop and start < b]
            finish = self._finisher(a, members, spans, waits, results)
            self._inflight += 1
            try:
                if not here or k < room:
                    self._launch(flat[a:b], finish)
                else:
                    self.loop_pieces += 1
                    finish(run_jobs(self.arena.view, flat[a:b]))
            except Exception as exc:  # noqa: BLE001 - fail the waiters, not the loop
                finish(exc)

    def _finisher(
        self,
        start: int,
        members: list[int],
        spans: list[tuple[asyncio.Future[list[Result]], int, int]],
        waits: list[int],
        results: list[Result],
    ) -> _Done:
        """The callback of one piece: store its results, finish the requests it ends, launch what waited."""

        def done(out: list[Result] | BaseException) -> None:
            self._inflight -= 1
            if self._pending:
                with contextlib.suppress(RuntimeError):  # no running loop: the engine is being torn down
                    self._schedule(asyncio.get_running_loop())
            if not isinstance(out, BaseException):
                results[start : start + len(out)] = out
            for i in members:
                fut, lo, hi = spans[i]
                waits[i] -= 1
                if fut.done():
                    continue
                if isinstance(out, BaseException):
                    fut.set_exception(out)
                elif waits[i] == 0:
                    fut.set_result(results[lo:hi])

        return done

    @abc.abstractmethod
    def _launch(self, jobs: list[Job], done: _Done) -> None:
        """Start ``jobs``; call ``done`` (in the loop thread) with results or an exception."""

    def prepare(self, block_size: int, codec: Codec) -> None:
        """Get ready for blocks of ``block_size`` in ``codec`` before the first request is accepted.

        A GPU engine captures its CUDA graphs and builds its CRC tables here; whatever it skips it pays
        inside the first client requests (session 8: front ends that skipped it spent their first
        0.85-1.1 s, and 3-4 CPU-seconds, of every GPU fill warming up). Records how long it took in
        :attr:`prepare_s` and what it prepared for in :attr:`prepared_for`.
        """
        t0 = time.perf_counter()
        self._prepare(block_size, codec)
        self.prepare_s += time.perf_counter() - t0
        self.prepared_for = (block_size, codec)

    def _prepare(self, block_size: int, codec: Codec) -> None:
        """The engine's own warm-up for :meth:`prepare` (default: nothing)."""
        return None

    def report(self) -> dict[str, Any]:
        """Batches launched and jobs in them; :meth:`prepare`'s seconds and the block size it ran for (0: never)."""
        block = self.prepared_for[0] if self.prepared_for else 0
        return {"engine_batches": self.batches, "engine_jobs": self.jobs, "engine_prepare_s": self.prepare_s,
                "engine_prepared_block": block}  # fmt: skip

    def close(self) -> None:
        """Stop workers and unmap the arena."""
        self.arena.close()


def _cheap(job: Job, below: int) -> bool:
    """Whether ``job`` costs less than a handoff: it decompresses a small block or copies a raw one."""
    return job[0] == Op.DECOMPRESS and (job[5] < below or job[1] == Codec.RAW)  # job[5]: the block's size


def _split(n_jobs: int, parts: int, min_jobs: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges cutting ``n_jobs`` into at most ``parts`` pieces of at least ``min_jobs``."""
    pieces = max(1, min(parts, n_jobs // max(min_jobs, 1)))
    per = -(-n_jobs // pieces)
    return [(start, min(start + per, n_jobs)) for start in range(0, n_jobs, per)]
