"""The ``torch`` payload engine: batched ZVC kernels and CRCs on a GPU (or the CPU), several launches in flight.

Each loop turn's jobs are cut into up to ``workers`` pieces of at least 1 MiB
of payload (a launch sequence costs about the same for 4 KiB or 4 MiB); each piece runs
in a launch thread of its own, on that thread's CUDA stream, through
:class:`~carina.infra.storage.zvcbatch.ZvcBatcher` (one host-to-device copy and
one kernel sequence per block length, one device-to-host copy of the blocks and
their results per block length, one wait per batch). While one piece waits for its
copies another piece's kernels run, so copies and compute of different
pieces overlap. On CUDA the arena is registered with ``cudaHostRegister``
(page-locked in place): payloads are DMA'd straight from the slots that the
socket filled and straight into the slots that replies are sent from, with no
staging copy; where registration fails the same copies go through pageable
memory (slower, same bytes) and :attr:`TorchEngine.registered` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

from carina.core.errors import BackendUnavailable
from carina.infra.storage.codecs import Codec, Job, Result
from carina.infra.storage.enginebase import Arena, PayloadEngine, _Done
from carina.infra.storage.zvcbatch import ZvcBatcher

__all__ = ["TorchEngine"]

log = logging.getLogger("carina.infra.storage")


class TorchEngine(PayloadEngine):
    """Batched ZVC kernels in torch on ``device`` (CUDA when present), ``workers`` launch threads and streams.

    Args:
        arena_bytes: Size of the payload arena.
        device: ``auto`` (CUDA when visible, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        workers: Launch threads, each with its own CUDA stream (pieces of a loop turn in flight at once).
    """

    name = "torch"
    min_piece_bytes = 1 << 20  # a loop turn of less than 2 MiB is not cut up: fewer, fuller launches

    def __init__(self, arena_bytes: int, *, device: str = "auto", workers: int = 2, max_inflight: int = -1) -> None:
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailable(f"{self.name} engine asked for CUDA but none is visible", device=device)
        # one batch per launch thread in flight: what arrives meanwhile (from every connection) is the next batch
        super().__init__(Arena(arena_bytes), max_inflight=workers if max_inflight < 0 else max_inflight)
        self.device = device
        self.workers = self.pieces = workers
        self._batcher: Any = self._make_batcher()
        self._clock = self._batcher.clock  # kept past close(): the final report is made after it
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="carina-torch-codec")
        self._pool.submit(self._warm_up).result()
        self.registered = self._register()

    def _make_batcher(self) -> Any:
        """What runs a piece's jobs on the device: ZVC kernels here."""
        # raw blocks go to the device too when it is a GPU (payloads bypass the host); on the CPU zlib does them
        return ZvcBatcher(self.arena.view, self.device, raw_reads=self.cuda)

    @property
    def cuda(self) -> bool:
        """Whether the kernels run on a CUDA device."""
        return self.device.startswith("cuda")

    def _warm_up(self) -> None:
        """Run each kernel once so the first client request does not pay for lazy initialisation."""
        import torch

        from carina.infra.storage.zvc import pack_rows, unpack_rows

        blocks = (torch.arange(1024, dtype=torch.int32) % 3).to(torch.uint8).view(2, 512).to(self.device)
        packed, codec, size = pack_rows(blocks)
        unpack_rows(packed, codec, size)
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _register(self) -> bool:
        """Page-lock the arena for DMA (CUDA only); ``False`` (and a warning) when the driver refuses."""
        if not self.cuda:
            return False
        import torch

        host = self._batcher.host
        err: object = None
        try:
            err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel(), 0)
        except (AttributeError, RuntimeError, TypeError) as exc:
            err = exc
        ok = bool(host.is_pinned())  # what the driver says, whatever the binding returned
        if not ok:
            log.warning("cudaHostRegister of the %d-byte arena failed (%s): copies use pageable memory",
                        host.numel(), err)  # fmt: skip
            with contextlib.suppress(RuntimeError):  # clear the error the failed call left for the next launch
                torch.ones(1, device=self.device).add_(1)
                torch.cuda.synchronize(self.device)
        return ok

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """The torch engine runs ZVC (and stores raw); other codecs need a CPU engine."""
        if isinstance(request, Codec) and request not in (Codec.ZVC, Codec.RAW):
            return [f"the torch engine has no {request.name.lower()} kernel; use --codec zvc"]
        return super().unsupported_reasons(request)

    def _prepare(self, block_size: int, codec: Codec) -> None:
        """On CUDA: capture every launch thread's graphs for ``block_size`` now, not in the first requests."""
        if self.cuda:
            self._on_each_launch_thread(self._prepare_thread, block_size, codec)

    def _on_each_launch_thread(self, fn: Any, *args: Any) -> None:
        """Run ``fn(k, *args)`` once on each launch thread ``k`` (their stream, their objects), one at a time.

        A barrier holds each task until every launch thread has one, so no thread runs two; then they run
        one after another, so no thread's work lands in another's CUDA graph capture (two launch threads
        preparing at once failed with ``cudaErrorStreamCaptureInvalidated`` on the s14 H100). The first
        failure is raised once all have ended.
        """
        gate, turn = threading.Barrier(self.workers), threading.Lock()

        def task(k: int) -> None:
            gate.wait(60)
            with turn:
                fn(k, *args)

        for f in [self._pool.submit(task, k) for k in range(self.workers)]:
            f.result()

    def _prepare_thread(self, k: int, block_size: int, codec: Codec) -> None:
        """Run compress and decompress batches of every graph bucket through this thread's stream."""
        from carina.infra.storage.codecs import Op

        runner = self._batcher.graphs
        rows, room = 1, self.arena.nbytes // (2 * block_size)
        while rows * block_size <= runner.max_bytes and rows <= room:
            b, span = block_size, rows * block_size
            pack: list[Job] = [(Op.COMPRESS, codec, i * b, b, span + i * b, b, 0) for i in range(rows)]
            unpack: list[Job] = [(Op.DECOMPRESS, codec, span + i * b, b // 2, i * b, b, 1) for i in range(rows)]
            for jobs in (pack, unpack):
                with contextlib.suppress(Exception):  # a warm-up batch may fail its checks; its graphs are made
                    self._run_piece(jobs)
            rows *= 2

    def prepare(self, block_size: int, codec: Codec) -> None:
        """:meth:`PayloadEngine.prepare`; the warm-up's batches are then dropped from the step times."""
        super().prepare(block_size, codec)
        self._clock.reset()

    def report(self) -> dict[str, Any]:
        """The base report and where the launch threads' batches spent their time (:mod:`.stepclock`)."""
        return {**super().report(), **self._clock.report()}

    def _stream(self) -> Any:
        """This launch thread's CUDA stream (``None`` on the CPU)."""
        if not self.cuda:
            return None
        stream = getattr(self._local, "stream", None)
        if stream is None:
            import torch

            stream = self._local.stream = torch.cuda.Stream(device=self.device)
        return stream

    def _run_piece(self, jobs: list[Job]) -> list[Result]:
        return cast(list[Result], self._batcher.run(jobs, stream=self._stream()))

    def _launch(self, jobs: list[Job], done: _Done) -> None:
        loop = asyncio.get_running_loop()
        fut = self._pool.submit(self._run_piece, jobs)

        def finished(f: Future[list[Result]]) -> None:
            exc = f.exception()
            loop.call_soon_threadsafe(done, exc if exc is not None else f.result())

        fut.add_done_callback(finished)

    def close(self) -> None:
        """Stop the launch threads, unregister and unmap the arena."""
        self._pool.shutdown(wait=True)
        if self.registered and self._batcher is not None:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.cudart().cudaHostUnregister(self._batcher.host.data_ptr())
            self.registered = False
        self._batcher = None
        super().close()
