"""LZ4, zstd and deflate jobs as device batches through a batched codec (nVIDIA nvCOMP on a GPU).

A batch of jobs is grouped by operation, codec and block length; each group
moves in one host-to-device copy (:class:`~carina.infra.storage.rowcopy.RowMover`
gathers the blocks of every request in it), is compressed or decompressed by
one batched codec call (every block one chunk of nvCOMP's batch API, in the
raw bitstream, so the stored bytes are plain LZ4 blocks, zstd frames and raw
deflate streams that the CPU engines read and write too), has its CRC-32s
computed on the device (:mod:`carina.infra.storage.crc`) and comes back in one
device-to-host copy with one small read-back of the results. The rules of
:func:`~carina.infra.storage.codecs.compress_block` hold: an all-zero block
is a hole, a block that does not shrink is stored raw, decompression checks
the stored CRC first. Jobs no device group takes (raw blocks, other codecs,
blocks larger than the codec's chunk limit) run on the CPU, and a group the
device codec rejects (undecodable input) is redone on the CPU, which reports
each block's error exactly::

    batcher = NvcompBatcher(arena_view, "cuda", NvcompCodecs("cuda"))
    results = batcher.run(jobs, stream=stream)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np

from carina.infra.storage.codecs import (
    ERR_CHECKSUM,
    ERR_CORRUPT,
    Codec,
    Job,
    Op,
    Result,
    job_groups,
    job_table,
    run_jobs,
)
from carina.infra.storage.graphs import GraphRunner
from carina.infra.storage.rowcopy import RowMover, runs_of
from carina.infra.storage.stepclock import StepClock
from carina.infra.storage.zvcbatch import host_crc32, read_back

__all__ = ["BatchCodec", "NVCOMP_ALGORITHMS", "NvcompBatcher", "NvcompCodecs"]

#: carina codec -> nvCOMP algorithm name, and the largest block (chunk) nvCOMP takes for it.
NVCOMP_ALGORITHMS: dict[Codec, tuple[str, int]] = {
    Codec.LZ4: ("LZ4", 16 << 20),
    Codec.ZSTD: ("Zstd", 16 << 20),
    Codec.DEFLATE: ("Deflate", 64 << 10),
}


class BatchCodec(Protocol):
    """A codec that compresses or decompresses many equal-length rows in one call."""

    def max_block(self, codec: Codec) -> int:
        """Largest block this codec takes (0: not at all)."""

    def encode(self, rows: Any, codec: Codec, stream: Any) -> tuple[Any, Any]:
        """Compress each ``(n, L)`` row; ``(out (n, >= L), sizes (n,) int64)`` on the rows' device."""

    def decode(self, rows: Any, sizes: list[int], codec: Codec, stream: Any) -> tuple[Any, Any]:
        """Decompress each row's first ``sizes[i]`` bytes into ``L``; ``(blocks (n, L), decoded sizes (n,))``.

        Raises:
            Exception: Whatever the codec raises on input it cannot decode (the batcher then redoes it on the CPU).
        """


class NvcompCodecs:
    """:class:`BatchCodec` on nVIDIA nvCOMP's Python API (``nvidia.nvcomp``), one codec object per thread and stream.

    Args:
        device: A CUDA device (``cuda``, ``cuda:N``).
    """

    def __init__(self, device: str) -> None:
        import torch
        from nvidia import nvcomp  # noqa: F401 - fail here, not in the first request

        self.index = torch.device(device).index or 0
        self._local = threading.local()

    def max_block(self, codec: Codec) -> int:  # noqa: D102
        return NVCOMP_ALGORITHMS[codec][1] if codec in NVCOMP_ALGORITHMS else 0

    def _codec(self, codec: Codec, length: int, stream: Any) -> Any:
        from nvidia import nvcomp

        cache: dict[tuple[int, int, int], Any] = self._local.__dict__.setdefault("codecs", {})
        ptr = int(stream.cuda_stream) if stream is not None else 0
        key = (int(codec), length, ptr)
        if key not in cache:
            cache[key] = nvcomp.Codec(algorithm=NVCOMP_ALGORITHMS[codec][0], device_id=self.index, cuda_stream=ptr,
                                      bitstream_kind=nvcomp.BitstreamKind.RAW, uncomp_chunk_size=length)  # fmt: skip
        return cache[key]

    def encode(self, rows: Any, codec: Codec, stream: Any) -> tuple[Any, Any]:  # noqa: D102
        import torch
        from nvidia import nvcomp

        n, length = rows.shape
        nv = self._codec(codec, length, stream)
        ptr = int(stream.cuda_stream) if stream is not None else 0
        cap = -(-int(nv.get_max_comp_buffer_size(nvcomp.as_array(rows[0]))) // 64) * 64
        out = torch.empty((n, cap), dtype=torch.uint8, device=rows.device)
        srcs = nvcomp.as_arrays(rows.view(-1), [i * length for i in range(n)], [length] * n, ptr)
        dsts = nvcomp.as_arrays(out.view(-1), [i * cap for i in range(n)], [cap] * n, ptr)
        sizes = nv.encode(srcs, out=dsts).buffer_sizes  # waits for the batch
        return out, torch.tensor(sizes, dtype=torch.int64).to(rows.device, non_blocking=True)

    def decode(self, rows: Any, sizes: list[int], codec: Codec, stream: Any) -> tuple[Any, Any]:  # noqa: D102
        import torch
        from nvidia import nvcomp

        n, length = rows.shape
        nv = self._codec(codec, length, stream)
        ptr = int(stream.cuda_stream) if stream is not None else 0
        out = torch.empty((n, length), dtype=torch.uint8, device=rows.device)
        srcs = nvcomp.as_arrays(rows.view(-1), [i * length for i in range(n)], sizes, ptr)
        dsts = nvcomp.as_arrays(out.view(-1), [i * length for i in range(n)], [length] * n, ptr)
        got = nv.decode(srcs, out=dsts).buffer_sizes
        return out, torch.tensor(got, dtype=torch.int64).to(rows.device, non_blocking=True)


class NvcompBatcher:
    """Runs LZ4 / zstd / deflate jobs against one arena through a :class:`BatchCodec`, one call per group.

    Args:
        mv: The arena the jobs' offsets point into.
        device: Torch device of the rows (``cuda`` for nvCOMP; ``cpu`` with a CPU stand-in codec).
        codecs: The batched codec.
    """

    def __init__(self, mv: memoryview, device: str, codecs: BatchCodec) -> None:
        import torch

        self.mv = mv
        self.arena = np.frombuffer(mv, dtype=np.uint8)
        self.host = torch.from_numpy(self.arena)
        self.mover = RowMover(self.arena, self.host)
        # no CUDA graphs here: capturing next to nvCOMP calls on other launch threads failed on the H200
        # (cudaErrorStreamCaptureUnsupported, then an illegal memory access), so these steps run eagerly
        self.graphs = GraphRunner(max_bytes=0)
        self.clock = StepClock()  # where a batch's host time goes: nvCOMP's calls apart (the engine reports it)
        self.device = device
        self.codecs = codecs
        self.device_crc = device != "cpu"
        self.fallbacks = 0  # groups the device codec rejected and the CPU redid

    def _plan(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which jobs go to the device, and their block length."""
        op, codec, so, sl, do, dl = (a[:, k] for k in range(6))
        length = np.where(op == Op.COMPRESS, sl, dl)
        limit = np.zeros(len(a), dtype=np.int64)
        for c in NVCOMP_ALGORITHMS:
            limit[codec == c] = self.codecs.max_block(c)
        comp = (op == Op.COMPRESS) & (dl >= sl)
        dec = (op == Op.DECOMPRESS) & (sl > 0) & (sl < dl)
        size = len(self.arena)
        fits = (so >= 0) & (do >= 0) & (so + sl <= size) & (do + length <= size)
        return (comp | dec) & (length >= 8) & (length % 8 == 0) & (length <= limit) & fits, length

    def run(self, jobs: Sequence[Job], *, stream: Any = None) -> list[Result]:
        """Results of ``jobs`` (in order); ``stream`` is the CUDA stream to run on (``None``: the current one)."""
        n = len(jobs)
        if not n:
            return []
        with self.clock.step("plan"):
            a = job_table(jobs)
            out = np.zeros((n, 3), dtype=np.int64)
            take, length = self._plan(a)
            idx = np.flatnonzero(take)
            groups = job_groups(idx, (a[idx, 0] << 48) | (a[idx, 1] << 40) | length[idx])
        for k, group in groups:
            op, codec, ln = k >> 48, Codec((k >> 40) & 0xFF), k & ((1 << 40) - 1)
            try:
                out[group] = self._group(a[group], op, codec, ln, stream)
            except Exception:  # noqa: BLE001 - input the device codec cannot take: the CPU says which block
                self.fallbacks += 1
                out[group] = run_jobs(self.mv, [jobs[i] for i in group.tolist()])
        rest = np.flatnonzero(~take).tolist()
        if rest:
            with self.clock.step("cpu"):
                out[rest] = run_jobs(self.mv, [jobs[i] for i in rest])
        with self.clock.step("scatter"):
            return cast(list[Result], list(map(tuple, out.tolist())))

    def _group(self, a: np.ndarray, op: int, codec: Codec, length: int, stream: Any) -> np.ndarray:
        """Jobs of one operation, codec and block length: upload, codec call, CRCs, download; ``(n, 3)`` results."""
        import torch

        from carina.infra.storage.crc import row_crc32

        clock = self.clock
        with clock.step("plan"):
            runs = runs_of(a[:, 2], a[:, 4], length)
            crc = row_crc32(length, self.device) if self.device_crc else host_crc32
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            with clock.step("upload"):
                rows = torch.empty((len(a), length), dtype=torch.uint8, device=self.device)
                self.mover.upload(rows, runs, length)
            if op == Op.COMPRESS:
                blocks, res = self._compress(rows, codec, crc, stream)
            else:
                blocks, res = self._decompress(rows, a, codec, crc, stream)
            with clock.step("download"):
                scatter = self.mover.download(blocks, runs, length)
                out = read_back(res)
        with clock.step("scatter"):
            scatter()
        return out

    def _compress(self, rows: Any, codec: Codec, crc: Any, stream: Any) -> tuple[Any, Any]:
        """Stored bytes (compressed, or the block itself when that is no smaller) and ``(codec, size, crc)``."""
        length = rows.shape[1]
        with self.clock.step("codec"):
            packed, sizes = self.codecs.encode(rows, codec, stream)
        step = functools.partial(_stored_step, codec=int(codec), crc=crc)
        with self.clock.step("device"):
            return self.graphs(("nvcomp-stored", length), step, (rows, packed[:, :length], sizes), stream=stream)

    def _decompress(self, rows: Any, a: np.ndarray, codec: Codec, crc: Any, stream: Any) -> tuple[Any, Any]:
        """Blocks (zero where the check failed) and ``(codec, length or error, crc)`` of each stored row."""
        import torch

        length = rows.shape[1]
        with self.clock.step("device"):
            meta = torch.from_numpy(np.ascontiguousarray(a[:, [3, 6]])).to(rows.device, non_blocking=True)
            rows, same = self.graphs(("nvcomp-check", length), functools.partial(_check_step, crc=crc), (rows, meta),
                                     stream=stream)  # fmt: skip
        with self.clock.step("codec"):
            blocks, got = self.codecs.decode(rows, a[:, 3].tolist(), codec, stream)
        with self.clock.step("device"):
            good = same & (got == length)
            status = torch.where(same, torch.where(good, length, ERR_CORRUPT), ERR_CHECKSUM)
            codes = torch.full_like(status, int(codec))
            return blocks * good.unsqueeze(1), torch.stack([codes, status, torch.where(good, meta[:, 1], 0)], 1)


def _stored_step(rows: Any, packed: Any, sizes: Any, *, codec: int, crc: Any) -> tuple[Any, Any]:
    """What each row is stored as after compression, and its ``(codec, size, crc)`` (one graph on CUDA)."""
    import torch

    length = rows.shape[1]
    zero = rows.amax(1) == 0
    shrunk = (sizes < length) & ~zero
    width = torch.arange(length, device=rows.device)
    packed = packed * (width < sizes.unsqueeze(1))  # zero past the size, as the CRC rows need
    stored = torch.where(shrunk.unsqueeze(1), packed, rows)
    size = torch.where(zero, 0, torch.where(shrunk, sizes, length))
    used = shrunk.long() * codec  # Codec.RAW is 0
    return stored, torch.stack([used, size, torch.where(zero, 0, crc(stored, size))], 1)


def _check_step(rows: Any, meta: Any, *, crc: Any) -> tuple[Any, Any]:
    """Stored rows zeroed past their size, and whether each one's CRC-32 is the expected one (``meta``: size, crc)."""
    import torch

    length = rows.shape[1]
    size, want = meta[:, 0], meta[:, 1]
    rows = rows * (torch.arange(length, device=rows.device) < size.unsqueeze(1))
    return rows, crc(rows, size) == want
