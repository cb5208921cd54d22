"""Payload engines: where blocks are compressed and decompressed.

Every engine owns an :class:`Arena`, one flat buffer that the front end
receives payloads into and sends replies from, and runs :data:`~carina.infra.
storage.codecs.Job` lists against it. Jobs submitted in the same event-loop
turn are coalesced into one batch, so small requests share a launch::

    engine = build_engine(EngineConfig(kind=EngineKind.PROCESS, workers=2), arena_bytes=1 << 24)
    results = await engine.run(jobs)        # list of (codec, out_len, crc)
    engine.close()

``inline`` runs jobs in the event loop's own thread (the single-process middle
tier), ``thread`` in a pool of threads of the same process (zlib, lz4 and zstd
release the GIL while they compress, so the threads run in parallel with each
other and with the event loop; no pipes, no pickling), ``process`` in worker
processes that map the same arena (shared memory, no payload copies over
pipes), ``torch`` in launch threads driving batched ZVC kernels on a GPU or the CPU, ``nvcomp`` in the
same launch threads driving nVIDIA nvCOMP's batched codecs. An engine may cap the batches in flight
(``max_inflight``): jobs submitted meanwhile, from every connection, wait and leave together as the next
batch (the GPU engines keep one per launch thread).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from carina.core.errors import BackendUnavailable
from carina.infra.storage.codecs import Codec, Job, Result, run_jobs
from carina.infra.storage.config import EngineConfig, EngineKind, Overflow
from carina.infra.storage.cudawait import set_cuda_wait
from carina.infra.storage.enginebase import Arena, PayloadEngine, _Done

__all__ = ["Arena", "InlineEngine", "PayloadEngine", "ThreadEngine", "build_engine"]  # ProcessEngine: lazily

log = logging.getLogger("carina.infra.storage")


class InlineEngine(PayloadEngine):
    """Runs jobs in the event loop's thread: the single-process CPU middle tier."""

    name = "inline"
    runs_inline = True

    def __init__(self, arena_bytes: int) -> None:
        super().__init__(Arena(arena_bytes))

    async def run(self, jobs: Sequence[Job]) -> list[Result]:
        """Run ``jobs`` right here, before returning (no batching: there is nothing to hand off)."""
        return self.run_now(jobs)

    def run_now(self, jobs: Sequence[Job]) -> list[Result]:
        """Run ``jobs`` in the caller's thread."""
        self.batches += 1
        self.jobs += len(jobs)
        return run_jobs(self.arena.view, jobs)

    def _launch(self, jobs: list[Job], done: _Done) -> None:
        done(run_jobs(self.arena.view, jobs))


class ThreadEngine(PayloadEngine):
    """A pool of threads in the front end's process; the codecs release the GIL while they run.

    Each loop turn's jobs are cut into one piece per thread (pieces of at least
    ``min_jobs`` jobs: a handoff costs tens of microseconds, more than a 4 KiB
    LZ4 block), and even a single piece runs in the pool, so the event loop
    keeps parsing headers meanwhile.
    """

    name = "thread"

    def __init__(
        self,
        arena_bytes: int,
        *,
        workers: int = 2,
        min_jobs: int = 1,
        max_inflight: int = 0,
        overflow: Overflow = Overflow.QUEUE,
    ) -> None:
        super().__init__(Arena(arena_bytes), max_inflight=max_inflight, overflow=overflow)
        self.workers = self.pieces = workers
        self.min_jobs = min_jobs
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="carina-codec")

    def _launch(self, jobs: list[Job], done: _Done) -> None:
        loop = asyncio.get_running_loop()

        def finished(f: Future[list[Result]]) -> None:  # runs in the loop thread
            exc = f.exception()
            done(exc if exc is not None else f.result())

        fut = self._pool.submit(run_jobs, self.arena.view, jobs)
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(finished, f))

    def close(self) -> None:
        """Join the threads, unmap the arena."""
        self._pool.shutdown(wait=True)
        super().close()


def _resolved_device(device: str) -> str:
    """``auto`` -> ``cuda`` where CUDA is visible, else ``cpu`` (what the GPU engines resolve it to)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_engine(config: EngineConfig, *, arena_bytes: int, codec: Codec) -> PayloadEngine:
    """Build the engine ``config`` names and check it can run ``codec``.

    Raises:
        BackendUnavailable: The engine cannot run here or cannot run ``codec``.
    """
    engine: PayloadEngine
    gate: dict[str, Any] = {} if config.inflight is None else {"max_inflight": config.inflight}
    wait_note = ""
    if config.kind in (EngineKind.TORCH, EngineKind.NVCOMP):  # before the engine's first CUDA call
        wait_note = set_cuda_wait(_resolved_device(config.device), config.cuda_wait)
    if config.kind == EngineKind.INLINE:
        engine = InlineEngine(arena_bytes)
    elif config.kind == EngineKind.THREAD:
        engine = ThreadEngine(arena_bytes, workers=config.workers, overflow=config.overflow, **gate)
    elif config.kind == EngineKind.PROCESS:
        from carina.infra.storage.procengine import ProcessEngine

        engine = ProcessEngine(arena_bytes, workers=config.workers, overflow=config.overflow, **gate)
    elif config.kind == EngineKind.NVCOMP:
        from carina.infra.storage.nvcomp_engine import NvcompEngine

        engine = NvcompEngine(arena_bytes, device=config.device, workers=config.workers, codec=codec, **gate)
    else:
        from carina.infra.storage.torch_engine import TorchEngine

        engine = TorchEngine(arena_bytes, device=config.device, workers=config.workers, **gate)
    if config.kind in (EngineKind.THREAD, EngineKind.PROCESS):
        engine.loop_below = config.loop_below
    engine.cuda_wait_note = wait_note
    reasons = engine.unsupported_reasons(codec)
    if reasons:
        engine.close()
        raise BackendUnavailable(f"{engine.name} engine cannot run {codec.name.lower()}: {'; '.join(reasons)}")
    return engine


def __getattr__(name: str) -> Any:
    """``TorchEngine`` and ``ProcessEngine`` live in their own modules (imported on first use)."""
    if name == "TorchEngine":
        from carina.infra.storage.torch_engine import TorchEngine

        return TorchEngine
    if name == "ProcessEngine":
        from carina.infra.storage.procengine import ProcessEngine

        return ProcessEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
