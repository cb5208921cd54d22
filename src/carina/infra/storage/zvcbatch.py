"""ZVC jobs as device batches: a few host steps per group of blocks, none per block.

A batch's jobs are planned once (:mod:`carina.infra.storage.zvcplan`: which jobs the device takes,
grouped by operation and block length, with their offsets and decoding metadata) and each group runs
as one kernel sequence (:func:`~carina.infra.storage.zvc.pack_rows`,
:func:`~carina.infra.storage.zvc.unpack_rows`, every CRC-32 by :mod:`carina.infra.storage.crc`). A group
whose sources lie back to back is read straight from the arena (which
:class:`~carina.infra.storage.torch_engine.TorchEngine` registers with CUDA, so the copy is DMA);
otherwise its blocks, and the codec, stored length and CRC that decoding checks, are gathered into this
launch thread's staging buffer by one numpy call (:mod:`carina.infra.storage.zvcstage`) and go to the
device in one copy. With ``graph_inputs`` (off by default: its GPU test has not run on a device yet),
once the launch thread's CUDA graph for a group's bucket exists, those copies go
straight into the graph's inputs (:meth:`~carina.infra.storage.graphs.GraphRunner.inputs`), so the
replay copies nothing. The steps write each row's ``(codec, size or status, CRC)`` and the rows into
one buffer, results first, so a group comes back in one copy into the staging (or, when its
destinations lie back to back, its rows straight into the arena and its results apart); the host
waits once per batch for every group. Buffers and the views into them are kept per launch thread and
batch shape, so a batch like the last one makes no allocations and no new tensors. With
``device="cpu"`` the same code runs in torch on the CPU (the copies to and from the device are then
none)::

    results = ZvcBatcher(arena_view, "cuda", raw_reads=True).run(jobs, stream=stream)
"""

from __future__ import annotations

import functools
import threading
import zlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from carina.infra.storage.blockcodec import ERR_CHECKSUM, ERR_CORRUPT, Codec, Job, Op, Result, run_cpu_jobs
from carina.infra.storage.graphs import GraphRunner
from carina.infra.storage.stepclock import Laps, StepClock
from carina.infra.storage.zvc import pack_rows, unpack_rows
from carina.infra.storage.zvcplan import Group, plan_jobs
from carina.infra.storage.zvcstage import HostStage

__all__ = ["ZvcBatcher", "host_crc32", "read_back", "run_zvc_jobs"]

_COMPRESS, _DECOMPRESS = int(Op.COMPRESS), int(Op.DECOMPRESS)
_NAMES = {_COMPRESS: "zvc-pack", _DECOMPRESS: "zvc-unpack"}  # graph keys, by operation


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
        graph_inputs: On CUDA, copy a group's inputs straight into its captured graph's static inputs
            (one copy less per argument). Off by default until its ``gpu`` test has run on a device.

    Attributes:
        copies: Host/device copy calls issued (none on the CPU; a test and a benchmark read it).
    """

    def __init__(
        self,
        mv: memoryview,
        device: str,
        *,
        raw_reads: bool = False,
        device_crc: bool | None = None,
        graph_inputs: bool = False,
    ) -> None:
        import torch

        self.mv = mv
        self.arena = np.frombuffer(mv, dtype=np.uint8)
        self._size = len(self.arena)
        self.host = torch.from_numpy(self.arena)
        self.stage = HostStage(self.arena, self.host)
        self.graphs = GraphRunner()
        self.clock = StepClock()  # where a batch's host time goes (the engine reports it)
        self.device = device
        self.raw_reads = raw_reads
        self.device_crc = device != "cpu" if device_crc is None else device_crc
        self.copies = 0
        self._cuda = torch.device(device).type == "cuda"
        # uploads straight into the CUDA graphs' inputs (session 14): off until its gpu test has run on a device
        self._graph_inputs = graph_inputs and self._cuda
        self._u8 = torch.uint8
        self._steps: dict[tuple[int, int], Any] = {}  # (op, block length) -> its device step, CRC bound
        self._local = threading.local()  # each launch thread's wait event

    def run(self, jobs: Sequence[Job], *, stream: Any = None) -> list[Result]:
        """Results of ``jobs`` (in order); ``stream`` is the CUDA stream to run on (``None``: the current one).

        Jobs the device does not take run on the CPU (:func:`~carina.infra.storage.blockcodec.run_cpu_jobs`),
        while the device works, except malformed ZVC jobs (block length not a multiple of 8, too small a
        destination), which fail with ``ERR_CORRUPT``. Every group's copies back are queued before one
        wait for all of them. The steps are timed as laps (:class:`~carina.infra.storage.stepclock.Laps`).
        """
        if not jobs:
            return []
        laps = self.clock.laps()
        try:
            if stream is None:
                return self._run(jobs, None, laps)
            import torch

            with torch.cuda.stream(stream):
                return self._run(jobs, stream, laps)
        finally:
            laps.close()

    def _run(self, jobs: Sequence[Job], stream: Any, laps: Laps) -> list[Result]:
        """:meth:`run` on the current stream, its steps timed as ``laps``."""
        plan = plan_jobs(jobs, self._size, raw_reads=self.raw_reads)
        laps.lap("plan")
        offs = [0, 0, 0]  # this batch's use of its buffers: upload and download bytes, result rows
        pending = [self._group(g, stream, offs, laps) for g in plan.groups]
        bad, other = plan.bad, plan.other
        out = np.zeros((len(jobs), 3), dtype=np.int64) if bad or other or len(pending) != 1 else None
        if out is not None and (bad or other):
            out[bad] = (int(Codec.ZVC), ERR_CORRUPT, 0)
            if other:
                out[other] = run_cpu_jobs(self.mv, [jobs[i] for i in other])
                laps.lap("cpu")
        if self._cuda and pending:
            self._wait()
            laps.lap("download")
        scatter = self.stage.scatter
        for g, rows, res in pending:
            if rows is not None:
                scatter(rows, g.dst, g.length)
            if out is None:  # one group of every job, in order: its results are the batch's
                got = list(map(tuple, res.tolist()))
                laps.lap("scatter")
                return cast(list[Result], got)
            out[g.rows] = res
        assert out is not None
        got = list(map(tuple, out.tolist()))
        laps.lap("scatter")
        return cast(list[Result], got)

    def _step(self, op: int, length: int) -> Any:
        """The device step of ``op`` on blocks of ``length`` bytes, with its CRC bound (made once)."""
        step = self._steps.get((op, length))
        if step is None:
            from carina.infra.storage.crc import row_crc32

            crc = row_crc32(length, self.device) if self.device_crc else host_crc32
            step = functools.partial(_pack_step if op == Op.COMPRESS else _unpack_step, crc=crc)
            self._steps[(op, length)] = step
        return step

    def _group(self, g: Group, stream: Any, offs: list[int], laps: Laps) -> tuple[Group, Any, Any]:
        """Upload one group's rows, queue its kernels and its copies back.

        Returns ``(group, rows or None, results)``, the host arrays valid once :meth:`_wait` returns;
        rows are ``None`` when they were copied straight into the arena (CUDA, one run of back-to-back
        destinations).
        """
        op, length, m = g.op, g.length, len(g.src)
        step = self._steps.get((op, length)) or self._step(op, length)
        name = (_NAMES[op], length)
        # on CUDA, once this thread's graph for the bucket exists, the rows go straight into its inputs
        statics = self.graphs.inputs(name, m) if self._graph_inputs else None
        if op == _COMPRESS and g.src_run:  # one run: the rows are the arena's own bytes
            s0 = int(g.src[0])
            args: tuple[Any, ...] = (self.host[s0 : s0 + m * length].view(m, length),)
            if statics is not None:
                statics[0].copy_(args[0], non_blocking=True)
                args = statics
            elif self._cuda:
                args = (args[0].to(self.device, non_blocking=True),)
            self.copies += self._cuda
        else:  # rows (and, to decode, each job's codec, stored length and CRC) through this thread's staging
            key = (op, length, m, offs[0])
            rows_np, meta_np, up, dev, args, host_args, nbytes = self.stage.views(key, self._up_views, *key)
            offs[0] += nbytes
            self.stage.gather(rows_np, g.src, length, tail=g.tail)
            if meta_np is not None:
                meta_np[:] = g.meta
            if statics is not None:  # rows, then metadata, into the graph's inputs: no copies in the replay
                for static, host in zip(statics, host_args, strict=True):
                    static.copy_(host, non_blocking=True)
                args = statics
                self.copies += len(statics)
            elif dev is not up:  # one copy of rows and metadata to the device (on the CPU the rows are there)
                dev.copy_(up, non_blocking=True)
                self.copies += 1
        laps.lap("upload")
        blocks, res = self.graphs(name, step, args, stream=stream)
        laps.lap("device")
        got = self._download(blocks, res, g.dst, g.dst_run, length, offs)
        laps.lap("download")
        return g, got[0], got[1]

    def _up_views(self, op: int, length: int, m: int, off: int) -> tuple[Any, ...]:
        """Staging of ``m`` rows at byte ``off`` of this thread's upload buffer: host arrays, and the step's inputs."""
        import torch

        nbytes = m * length + (24 * m if op == _DECOMPRESS else 0)
        up = self.stage.buffer("up", off + nbytes, self.device)[off : off + nbytes]
        flat = up.numpy()
        rows = flat[: m * length].reshape(m, length)
        meta = flat[m * length :].view(np.int64) if op == _DECOMPRESS else None  # 3 per row, flat
        dev = up  # on the CPU the step reads the staging itself; on CUDA a region of one device buffer per thread
        if self._cuda:
            dev = self.stage.buffer("up-device", off + nbytes, self.device, on_device=True)[off : off + nbytes]
        args: tuple[Any, ...] = (dev[: m * length].view(m, length),)
        host_args: tuple[Any, ...] = (up[: m * length].view(m, length),)  # the same, on the host (CUDA graphs)
        if op == _DECOMPRESS:
            args += (dev[m * length :].view(torch.int64).view(m, 3),)
            host_args += (up[m * length :].view(torch.int64).view(m, 3),)
        return rows, meta, up, dev, args, host_args, nbytes

    def _download(self, blocks: Any, res: Any, dst: Any, run: bool, length: int, offs: list[int]) -> tuple[Any, Any]:
        """Queue the copies of ``blocks`` and ``res`` to the host (none on the CPU); their host arrays.

        The steps write their results and rows back to back (:func:`_results_and_rows`), so a group whose
        rows go through the read-back staging comes back in one copy; a group whose destinations lie back
        to back has its rows copied straight into the arena, and its results apart.
        """
        if not self._cuda:
            return blocks.numpy(), res.numpy()
        m = len(dst)
        gap = blocks.data_ptr() - res.data_ptr()  # 24 bytes per row of the steps' buffer (a graph's: its bucket's)
        if (not run and gap >= 24 * m and gap % 24 == 0
                and blocks.untyped_storage().data_ptr() == res.untyped_storage().data_ptr()):  # fmt: skip
            span = gap + m * length
            key = ("both", length, m, gap, offs[1])
            down, rows_np, res_np = self.stage.views(key, self._both_views, *key[1:])
            down.copy_(res.view(self._u8).as_strided((span,), (1,)), non_blocking=True)
            offs[1] += span
            self.copies += 1
            return rows_np, res_np
        rows: Any = None
        if run:  # straight into the (registered) arena
            self.host[int(dst[0]) : int(dst[0]) + m * length].view(m, length).copy_(blocks, non_blocking=True)
        else:
            down, rows = self.stage.views(("down", length, m, offs[1]), self._down_views, "down", length, m, offs[1])
            down.copy_(blocks, non_blocking=True)
            offs[1] += m * length
        res_t, res_np = self.stage.views(("res", m, offs[2]), self._down_views, "res", 24, m, 24 * offs[2])
        res_t.copy_(res, non_blocking=True)
        offs[2] += m
        self.copies += 2
        return rows, res_np

    def _down_views(self, which: str, width: int, m: int, off: int) -> tuple[Any, Any]:
        """``(m, width)`` rows at byte ``off`` of this thread's read-back buffer ``which``: tensor and array."""
        import torch

        buf = self.stage.buffer(which, off + m * width, self.device)[off : off + m * width]
        t = buf.view(m, width) if which == "down" else buf.view(torch.int64).view(m, 3)
        return t, t.numpy()

    def _both_views(self, length: int, m: int, gap: int, off: int) -> tuple[Any, Any, Any]:
        """``gap + m * length`` bytes at byte ``off`` of the read-back buffer: results first, rows at ``gap``."""
        span = gap + m * length
        buf = self.stage.buffer("down", off + span, self.device)[off : off + span]
        flat = buf.numpy()
        return buf, flat[gap:].reshape(m, length), flat[: 24 * m].view(np.int64).reshape(m, 3)

    def _wait(self) -> None:
        """Wait (sleeping, not spinning) until this thread's stream has done every copy queued so far (CUDA)."""
        if not self._cuda:
            return
        import torch

        done = getattr(self._local, "done", None)
        if done is None:
            done = self._local.done = torch.cuda.Event(blocking=True)
        done.record()
        done.synchronize()


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


def _results_and_rows(n: int, length: int, device: Any) -> tuple[Any, Any]:
    """``(n, 3)`` int64 results and ``(n, L)`` uint8 rows, back to back in one buffer (results first).

    So the rows and the results of a batch come back to the host in one copy
    (:meth:`ZvcBatcher._download`); in a CUDA graph the buffer is the graph's and a batch of
    fewer rows than its bucket reads the results of its rows, the padding's results and its rows.
    """
    import torch

    flat = torch.empty(n * (24 + length), dtype=torch.uint8, device=device)
    return flat[: 24 * n].view(torch.int64).view(n, 3), flat[24 * n :].view(n, length)


def _pack_step(rows: Any, *, crc: Any) -> tuple[Any, Any]:
    """ZVC-pack ``(n, L)`` rows: the stored rows and ``(codec, size, crc)`` of each (one graph on CUDA)."""
    import torch

    res, out = _results_and_rows(rows.shape[0], rows.shape[1], rows.device)
    blocks, codec, size = pack_rows(rows, out=out)
    torch.stack([codec, size, crc(blocks, size)], 1, out=res)
    return blocks, res


def _unpack_step(rows: Any, meta: Any, *, crc: Any) -> tuple[Any, Any]:
    """Check and decode stored rows; ``meta`` is ``(n, 3)``: codec, stored length, expected CRC."""
    return _unpack(rows, meta.T, crc)


def _unpack(rows: Any, meta: Any, crc: Any) -> tuple[Any, Any]:
    """Check and decode stored rows; ``meta`` is ``(codec, stored length, expected CRC)`` per row, stacked."""
    import torch

    codec, size, want = meta
    n, length = rows.shape
    rows = rows * (torch.arange(length, device=rows.device, dtype=torch.int32) < size.unsqueeze(1))
    same = crc(rows, size) == want
    blocks, ok = unpack_rows(rows, codec, size)
    good = same & ok
    status = torch.where(same, torch.where(ok, length, ERR_CORRUPT), ERR_CHECKSUM)
    res, out = _results_and_rows(n, length, rows.device)
    torch.mul(blocks, good.unsqueeze(1), out=out)
    torch.stack([codec, status, torch.where(good, want, 0)], 1, out=res)
    return out, res
