"""ZVC jobs as device batches, with no per-block Python work.

A batch of jobs is turned into arrays once (``np.fromiter`` over the job
tuples), grouped by operation and block length, and cut into *runs*: jobs
whose source and destination blocks lie back to back in the arena, as the
blocks of one NBD request do in its slot. Each run moves in one copy: host to
device before the kernels, device to host after them, straight from and into
the arena (which :class:`~carina.infra.storage.torch_engine.TorchEngine`
registers with CUDA, so the copies are DMA with no staging buffer). On the
device, one kernel sequence per group encodes or decodes every block
(:func:`~carina.infra.storage.zvc.pack_rows`, :func:`~carina.infra.storage.zvc.unpack_rows`)
and computes every CRC-32 (:mod:`carina.infra.storage.crc`); the host only
reads back one ``(n, 3)`` array of results. With ``device="cpu"`` the same
code runs in torch on the CPU::

    results = ZvcBatcher(arena_view, "cuda", raw_reads=True).run(jobs, stream=stream)
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from carina.infra.storage.blockcodec import (
    ERR_CHECKSUM,
    ERR_CORRUPT,
    Codec,
    Job,
    Op,
    Result,
    job_groups,
    job_table,
    run_cpu_jobs,
)
from carina.infra.storage.graphs import GraphRunner
from carina.infra.storage.rowcopy import RowMover, runs_of
from carina.infra.storage.stepclock import StepClock
from carina.infra.storage.zvc import pack_rows, unpack_rows

__all__ = ["ZvcBatcher", "host_crc32", "read_back", "run_zvc_jobs"]


class ZvcBatcher:
    """Runs ZVC jobs against one arena on one torch device, one kernel sequence per block length.

    Args:
        mv: The arena the jobs' offsets point into.
        device: Torch device of the kernels (``cpu`` runs the same code on the host).
        raw_reads: Also take DECOMPRESS jobs of blocks stored raw (CRC check and copy on the device),
            so a GPU engine moves every payload, not only the compressed ones.
        device_crc: CRC-32 by the device's matrix product (:class:`~carina.infra.storage.crc.RowCrc32`)
            rather than by ``zlib.crc32`` per block on the host. Default: on any device but the CPU,
            where zlib's table-driven loop is faster than the product.
    """

    def __init__(self, mv: memoryview, device: str, *, raw_reads: bool = False, device_crc: bool | None = None) -> None:
        import torch

        self.mv = mv
        self.arena = np.frombuffer(mv, dtype=np.uint8)
        self.host = torch.from_numpy(self.arena)
        self.mover = RowMover(self.arena, self.host)
        self.graphs = GraphRunner()
        self.clock = StepClock()  # where a batch's host time goes (the engine reports it)
        self.device = device
        self.raw_reads = raw_reads
        self.device_crc = device != "cpu" if device_crc is None else device_crc

    def _plan(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which jobs go to the device, and their block length."""
        op, codec, so, sl, do, dl = (a[:, k] for k in range(6))
        length = np.where(op == Op.COMPRESS, sl, dl)
        comp = (op == Op.COMPRESS) & (codec == Codec.ZVC) & (dl >= sl)
        raw = (codec == Codec.RAW) & (sl == dl) if self.raw_reads else np.zeros(len(a), dtype=bool)
        dec = (op == Op.DECOMPRESS) & (sl <= dl) & ((codec == Codec.ZVC) | raw)
        size = len(self.arena)
        fits = (so >= 0) & (do >= 0) & (so + sl <= size) & (do + length <= size)
        return (comp | dec) & (length >= 8) & (length % 8 == 0) & fits, length

    def run(self, jobs: Sequence[Job], *, stream: Any = None) -> list[Result]:
        """Results of ``jobs`` (in order); ``stream`` is the CUDA stream to run on (``None``: the current one).

        Jobs the device does not take run on the CPU (:func:`~carina.infra.storage.blockcodec.run_cpu_jobs`),
        except malformed ZVC jobs (block length not a multiple of 8, too small a destination),
        which fail with ``ERR_CORRUPT``.
        """
        n = len(jobs)
        if not n:
            return []
        with self.clock.step("plan"):
            a = job_table(jobs)
            out = np.zeros((n, 3), dtype=np.int64)
            take, length = self._plan(a)
            idx = np.flatnonzero(take)
            groups = job_groups(idx, a[idx, 0] * (1 << 40) + length[idx])
        for k, group in groups:
            out[group] = self._group(a[group], int(k >> 40), int(k & ((1 << 40) - 1)), stream)
        rest = np.flatnonzero(~take)
        bad = rest[a[rest, 1] == Codec.ZVC]
        out[bad] = (int(Codec.ZVC), ERR_CORRUPT, 0)
        other = rest[a[rest, 1] != Codec.ZVC].tolist()
        if other:
            with self.clock.step("cpu"):
                out[other] = run_cpu_jobs(self.mv, [jobs[i] for i in other])
        with self.clock.step("scatter"):
            return cast(list[Result], list(map(tuple, out.tolist())))

    def _group(self, a: np.ndarray, op: int, length: int, stream: Any) -> np.ndarray:
        """Jobs of one operation and block length: upload, kernels, download; ``(n, 3)`` results."""
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
            with clock.step("device"):
                if op == Op.COMPRESS:
                    blocks, res = self.graphs(("zvc-pack", length), functools.partial(_pack_step, crc=crc), (rows,),
                                              stream=stream)  # fmt: skip
                else:
                    meta = torch.from_numpy(np.ascontiguousarray(a[:, [1, 3, 6]])).to(self.device, non_blocking=True)
                    blocks, res = self.graphs(("zvc-unpack", length), functools.partial(_unpack_step, crc=crc),
                                              (rows, meta), stream=stream)  # fmt: skip
            with clock.step("download"):
                scatter = self.mover.download(blocks, runs, length)
                out = read_back(res)
        with clock.step("scatter"):
            scatter()
        return out


def run_zvc_jobs(mv: memoryview, jobs: Sequence[Job], *, device: str = "cpu") -> list[Result]:
    """Run ZVC jobs on ``device``: jobs of equal block length go to the device as one batch each."""
    return ZvcBatcher(mv, device).run(jobs)


def read_back(res: Any) -> np.ndarray:
    """The results on the host, once everything queued before them on this stream (the downloads) is done.

    On CUDA the wait is a blocking event (the thread sleeps instead of
    spinning in ``cudaStreamSynchronize``), so a launch thread waiting for the
    GPU does not use up a host core.
    """
    if not res.is_cuda:
        return np.asarray(res.numpy())
    import torch

    host = torch.empty(res.shape, dtype=res.dtype, pin_memory=True)
    host.copy_(res, non_blocking=True)
    done = torch.cuda.Event(blocking=True)
    done.record()
    done.synchronize()
    return np.asarray(host.numpy())


def host_crc32(rows: Any, lengths: Any) -> Any:
    """``zlib.crc32`` of each (CPU) row's first ``lengths`` bytes."""
    import torch

    r = rows.numpy()
    return torch.tensor([zlib.crc32(r[i, :s]) for i, s in enumerate(lengths.tolist())], dtype=torch.int64)


def _pack_step(rows: Any, *, crc: Any) -> tuple[Any, Any]:
    """ZVC-pack ``(n, L)`` rows: the stored rows and ``(codec, size, crc)`` of each (one graph on CUDA)."""
    import torch

    blocks, codec, size = pack_rows(rows)
    return blocks, torch.stack([codec, size, crc(blocks, size)], 1)


def _unpack_step(rows: Any, meta: Any, *, crc: Any) -> tuple[Any, Any]:
    """Check and decode stored rows; ``meta`` is ``(n, 3)``: codec, stored length, expected CRC."""
    return _unpack(rows, meta.T, crc)


def _unpack(rows: Any, meta: Any, crc: Any) -> tuple[Any, Any]:
    """Check and decode stored rows; ``meta`` is ``(codec, stored length, expected CRC)`` per row, stacked."""
    import torch

    codec, size, want = meta
    length = rows.shape[1]
    rows = rows * (torch.arange(length, device=rows.device, dtype=torch.int32) < size.unsqueeze(1))
    same = crc(rows, size) == want
    blocks, ok = unpack_rows(rows, codec, size)
    good = same & ok
    status = torch.where(same, torch.where(ok, length, ERR_CORRUPT), ERR_CHECKSUM)
    blocks = blocks * good.unsqueeze(1)
    return blocks, torch.stack([codec, status, torch.where(good, want, 0)], 1)
