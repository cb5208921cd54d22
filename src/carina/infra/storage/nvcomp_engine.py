"""The ``nvcomp`` payload engine: nVIDIA nvCOMP's batched LZ4 / zstd / deflate on a GPU, many blocks per launch.

It is the :class:`~carina.infra.storage.torch_engine.TorchEngine` (launch
threads, one CUDA stream each, the arena page-locked for DMA, at most one
batch per launch thread in flight so that everything arriving meanwhile goes
out as the next batch) with :class:`~carina.infra.storage.nvcompbatch.NvcompBatcher`
in place of the ZVC kernels. The blocks it stores are ordinary LZ4 blocks,
zstd frames and raw deflate streams, so a store written by this engine is read
by the CPU engines and the other way round. Where nvCOMP cannot run,
:func:`nvcomp_reasons` says why (and the engine refuses to start)::

    nvcomp_reasons("cuda")   # [] on a GPU host with nvidia-nvcomp-cu13 installed
    engine = NvcompEngine(arena_bytes, device="cuda", workers=2, codec=Codec.LZ4)
"""

from __future__ import annotations

import importlib.util
from typing import Any

from carina.core.errors import BackendUnavailable
from carina.infra.storage.codecs import Codec, Job, Op
from carina.infra.storage.nvcompbatch import NVCOMP_ALGORITHMS, BatchCodec, NvcompBatcher, NvcompCodecs
from carina.infra.storage.torch_engine import TorchEngine

__all__ = ["NvcompEngine", "nvcomp_reasons"]


def _torch_cuda() -> tuple[bool, str]:
    """Whether torch sees a CUDA device, and torch's CUDA major version ('' without CUDA)."""
    import torch

    version = torch.version.cuda or ""
    return torch.cuda.is_available(), version.split(".")[0]


def nvcomp_reasons(device: str, codec: Codec | None = None) -> list[str]:
    """Why the nvcomp engine cannot run on ``device`` (and ``codec``) here; empty when it can."""
    reasons = []
    cuda, major = _torch_cuda()
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.nvcomp") is None:
        wheel = f"nvidia-nvcomp-cu{major}" if major else "nvidia-nvcomp-cu13 (or -cu12, as torch's CUDA)"
        reasons.append(f"nVIDIA nvCOMP is not installed: pip install {wheel}")
    if device == "cpu" or (device != "auto" and not device.startswith("cuda")):
        reasons.append(f"nvCOMP runs on CUDA devices only (device={device})")
    elif not cuda:
        reasons.append("nvCOMP needs a CUDA device and torch sees none")
    if codec is not None and codec != Codec.RAW and codec not in NVCOMP_ALGORITHMS:
        reasons.append(f"nvCOMP has no {codec.name.lower()} codec here; use lz4, zstd or deflate")
    return reasons


class NvcompEngine(TorchEngine):
    """Batched nvCOMP codecs on ``device``, ``workers`` launch threads and streams.

    Args:
        arena_bytes: Size of the payload arena.
        device: ``auto`` or ``cuda``/``cuda:N`` (``cpu`` only with ``batch_codec``).
        workers: Launch threads, each with its own CUDA stream.
        max_inflight: Most batches in flight (-1: one per launch thread; 0: no limit).
        codec: The store's codec (checked up front).
        batch_codec: The batched codec; default nvCOMP. ``carina.testing.batchcodec`` has a CPU stand-in
            that lets the batching run (and be tested) where no GPU exists.

    Raises:
        BackendUnavailable: nvCOMP cannot run here (:func:`nvcomp_reasons` says why).
    """

    name = "nvcomp"

    def __init__(self, arena_bytes: int, *, device: str = "auto", workers: int = 2, max_inflight: int = -1,
                 codec: Codec | None = None, batch_codec: BatchCodec | None = None) -> None:  # fmt: skip
        if batch_codec is None:
            reasons = nvcomp_reasons(device, codec)
            if reasons:
                raise BackendUnavailable(f"nvcomp engine cannot run here: {'; '.join(reasons)}", device=device)
        self._batch_codec = batch_codec
        super().__init__(arena_bytes, device=device, workers=workers, max_inflight=max_inflight)

    def _make_batcher(self) -> Any:
        codecs = self._batch_codec if self._batch_codec is not None else NvcompCodecs(self.device)
        return NvcompBatcher(self.arena.view, self.device, codecs)

    def _warm_up(self) -> None:
        """Load the library and the CUDA context before the first request (no kernels to warm)."""
        import torch

        if self.cuda:
            torch.ones(1, device=self.device).add_(1)
            torch.cuda.synchronize(self.device)

    def _prepare(self, block_size: int, codec: Codec) -> None:
        """Every launch thread's nvCOMP codec, CRC tables and staging made now: a round trip of ``block_size`` each.

        The torch engine's warm-up captures graphs, and nvCOMP's steps have none, so before session 12 this
        engine prepared nothing (``engine_prepare_s`` 3-11 ms on the H200) and its front ends still built
        their codec objects and CRC tables inside the timed fill. Here each launch thread compresses
        :attr:`warm_rows` blocks of a repeating pattern and decompresses what it stored, on its own stream, and
        the bytes must come back exact.

        Raises:
            BackendUnavailable: The round trip did not give the blocks back (the engine must not serve).
        """
        if codec not in NVCOMP_ALGORITHMS or block_size < 8:
            return  # raw stores: nothing of nvCOMP's runs
        rows = self.warm_rows
        if (2 * self.workers + 1) * rows * block_size > self.arena.nbytes:
            return  # an arena too small for a warm-up (tests' tiny engines): the first requests warm it
        span = rows * block_size
        pattern = bytes(range(256)) * (-(-span // 256))
        self.arena.view[:span] = pattern[:span]
        self._on_each_launch_thread(self._warm_thread, block_size, codec)  # each makes its own codec objects

    #: Blocks in each launch thread's warm-up batch.
    warm_rows = 2

    def _warm_thread(self, k: int, block_size: int, codec: Codec) -> None:
        """Launch thread ``k``: compress the pattern at arena offset 0 into its own region, decompress it back."""
        b, span = block_size, self.warm_rows * block_size
        out, back = (1 + 2 * k) * span, (2 + 2 * k) * span
        pack: list[Job] = [(Op.COMPRESS, codec, i * b, b, out + i * b, b, 0) for i in range(self.warm_rows)]
        stored = self._run_piece(pack)
        unpack: list[Job] = [(Op.DECOMPRESS, used, out + i * b, size, back + i * b, b, crc)
                             for i, (used, size, crc) in enumerate(stored)]  # fmt: skip
        got = self._run_piece(unpack)
        view = self.arena.view
        if any(r[1] != b for r in got) or view[back : back + span] != view[:span]:
            raise BackendUnavailable(f"nvcomp engine: the {codec.name.lower()} warm-up round trip of "
                                     f"{b}-byte blocks failed ({got})", device=self.device)  # fmt: skip

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """NvCOMP runs LZ4, zstd and deflate (and stores raw)."""
        if isinstance(request, Codec) and request != Codec.RAW and request not in NVCOMP_ALGORITHMS:
            return [f"the nvcomp engine has no {request.name.lower()} codec; use --codec lz4, zstd or deflate"]
        return []
