"""A CPU stand-in for nVIDIA nvCOMP's batched codecs, for machines without a GPU.

:class:`CpuStandInBatchCodec` has the :class:`~carina.infra.storage.nvcompbatch.BatchCodec`
interface of :class:`~carina.infra.storage.nvcompbatch.NvcompCodecs` and runs
each row through the CPU codecs (lz4, zstandard, zlib raw deflate) on CPU torch
rows. It is NOT nvCOMP and NOT a GPU: it exists so that the nvcomp engine's
batching (grouping, gathering, holes, raw fallback, CRC checks, the CPU redo of
rejected groups) runs and is tested here with ``device="cpu"``; its speed means
nothing. ``reject`` makes ``decode`` raise, as nvCOMP does on input it cannot
decode::

    engine = NvcompEngine(arena_bytes, device="cpu", batch_codec=CpuStandInBatchCodec())
"""

from __future__ import annotations

from typing import Any

from carina.infra.storage.codecs import Codec, block_compressor, block_decompressor
from carina.infra.storage.nvcompbatch import NVCOMP_ALGORITHMS

__all__ = ["CpuStandInBatchCodec"]


class CpuStandInBatchCodec:
    """Per-row CPU codecs behind the batched-codec interface (a stand-in, named so in every result).

    Args:
        reject: Make every ``decode`` raise (what a device codec does on undecodable input).
    """

    name = "cpu-stand-in (not nvCOMP)"

    def __init__(self, *, reject: bool = False) -> None:
        self.reject = reject
        self.calls = 0

    def max_block(self, codec: Codec) -> int:
        """The same chunk limits as nvCOMP's."""
        return NVCOMP_ALGORITHMS[codec][1] if codec in NVCOMP_ALGORITHMS else 0

    def encode(self, rows: Any, codec: Codec, stream: Any) -> tuple[Any, Any]:
        """Compress each row on the CPU into rows of ``2 L`` bytes."""
        import torch

        self.calls += 1
        n, length = rows.shape
        out = torch.zeros((n, 2 * length), dtype=torch.uint8)
        sizes = torch.zeros(n, dtype=torch.int64)
        pack, host, dst = block_compressor(codec), rows.numpy(), out.numpy()
        for i in range(n):
            packed = pack(memoryview(host[i]))
            dst[i, : len(packed)] = bytearray(packed)
            sizes[i] = len(packed)
        return out, sizes

    def decode(self, rows: Any, sizes: list[int], codec: Codec, stream: Any) -> tuple[Any, Any]:
        """Decompress each row's first ``sizes[i]`` bytes; a row that fails decodes to 0 bytes."""
        import torch

        self.calls += 1
        if self.reject:
            raise RuntimeError("stand-in codec rejects this batch")
        n, length = rows.shape
        out = torch.zeros((n, length), dtype=torch.uint8)
        got = torch.zeros(n, dtype=torch.int64)
        unpack, host, dst = block_decompressor(codec), rows.numpy(), out.numpy()
        for i, s in enumerate(sizes):
            try:
                block = unpack(memoryview(host[i, :s]), length)
            except Exception:  # noqa: BLE001 - like a device codec: a failed chunk decodes to nothing
                continue
            dst[i, : len(block)] = bytearray(block)
            got[i] = len(block)
        return out, got
