"""The ``torch`` payload engine: batched ZVC kernels on a GPU (or the CPU), one launch per loop turn."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from carina.core.errors import BackendUnavailable
from carina.infra.storage.codecs import Codec, Job, Result, run_jobs
from carina.infra.storage.engines import Arena, PayloadEngine, _Done

__all__ = ["TorchEngine"]


class TorchEngine(PayloadEngine):
    """Batched ZVC kernels in torch on ``device`` (CUDA when present), one launch per batch."""

    name = "torch"

    def __init__(self, arena_bytes: int, *, device: str = "auto") -> None:
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailable("torch engine asked for CUDA but none is visible", device=device)
        super().__init__(Arena(arena_bytes))
        self.device = device
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="carina-torch-codec")
        self._pool.submit(self._warm_up).result()

    def _warm_up(self) -> None:
        """Run each kernel once so the first client request does not pay for lazy initialisation."""
        import torch

        from carina.infra.storage.zvc import zvc_compress, zvc_decompress

        blocks = (torch.arange(1024, dtype=torch.int32) % 3).to(torch.uint8).view(2, 512).to(self.device)
        bitmaps, _, values = zvc_compress(blocks)
        zvc_decompress(bitmaps, values)

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """The torch engine runs ZVC (and stores raw); other codecs need a CPU engine."""
        if isinstance(request, Codec) and request not in (Codec.ZVC, Codec.RAW):
            return [f"the torch engine has no {request.name.lower()} kernel; use --codec zvc"]
        return super().unsupported_reasons(request)

    def _launch(self, jobs: list[Job], done: _Done) -> None:
        loop = asyncio.get_running_loop()
        fut = self._pool.submit(run_jobs, self.arena.view, jobs, device=self.device)

        def finished(f: Future[list[Result]]) -> None:
            exc = f.exception()
            loop.call_soon_threadsafe(done, exc if exc is not None else f.result())

        fut.add_done_callback(finished)

    def close(self) -> None:
        """Stop the launch thread, unmap the arena."""
        self._pool.shutdown(wait=True)
        super().close()
