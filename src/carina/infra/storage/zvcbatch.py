"""ZVC jobs as device batches: a few host steps per group of blocks, none per block.

A batch's jobs are planned once (:mod:`carina.infra.storage.zvcplan`: which jobs the device takes,
grouped by operation and block length, with their offsets and decoding metadata) and each group runs
as one kernel sequence (:func:`~carina.infra.storage.zvc.pack_rows`,
:func:`~carina.infra.storage.zvc.unpack_rows`, every CRC-32 by :mod:`carina.infra.storage.crc`). A group
whose sources lie back to back is read straight from the arena (which
:class:`~carina.infra.storage.torch_engine.TorchEngine` registers with CUDA, so the copy is DMA);
otherwise its blocks, and the codec, stored length and CRC that decoding checks, are gathered into this
launch thread's staging buffer by one numpy call (:mod:`carina.infra.storage.zvcstage`) and go to the
device in one copy. Blocks come back in one copy per group, straight into the arena when their
destinations lie back to back, with an ``(n, 3)`` array of results; the host waits once per batch for
every group. Buffers and the views into them are kept per launch thread and batch shape, so a batch
like the last one makes no allocations and no new tensors. With ``device="cpu"`` the same code runs in
torch on the CPU (the copies to and from the device are then none)::

    results = ZvcBatcher(arena_view, "cuda", raw_reads=True).run(jobs, stream=stream)
"""

from __future__ import annotations

import contextlib
import functools
import threading
import zlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from carina.infra.storage.blockcodec import ERR_CHECKSUM, ERR_CORRUPT, Codec, Job, Op, Result, run_cpu_jobs
from carina.infra.storage.graphs import GraphRunner
from carina.infra.storage.stepclock import StepClock
from carina.infra.storage.zvc import pack_rows, unpack_rows
from carina.infra.storage.zvcplan import Group, plan_jobs
from carina.infra.storage.zvcstage import HostStage

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

    Attributes:
        copies: Host/device copy calls issued (none on the CPU; a test and a benchmark read it).
    """

    def __init__(self, mv: memoryview, device: str, *, raw_reads: bool = False, device_crc: bool | None = None) -> None:
        import torch

        self.mv = mv
        self.arena = np.frombuffer(mv, dtype=np.uint8)
        self.host = torch.from_numpy(self.arena)
        self.stage = HostStage(self.arena, self.host)
        self.graphs = GraphRunner()
        self.clock = StepClock()  # where a batch's host time goes (the engine reports it)
        self.device = device
        self.raw_reads = raw_reads
        self.device_crc = device != "cpu" if device_crc is None else device_crc
        self.copies = 0
        self._cuda = torch.device(device).type == "cuda"
        self._steps: dict[tuple[int, int], Any] = {}  # (op, block length) -> its device step, CRC bound
        self._local = threading.local()  # each launch thread's wait event

    def run(self, jobs: Sequence[Job], *, stream: Any = None) -> list[Result]:
        """Results of ``jobs`` (in order); ``stream`` is the CUDA stream to run on (``None``: the current one).

        Jobs the device does not take run on the CPU (:func:`~carina.infra.storage.blockcodec.run_cpu_jobs`),
        while the device works, except malformed ZVC jobs (block length not a multiple of 8, too small a
        destination), which fail with ``ERR_CORRUPT``. Every group's copies back are queued before one
        wait for all of them.
        """
        n = len(jobs)
        if not n:
            return []
        clock = self.clock
        with clock.step("plan"):
            plan = plan_jobs(jobs, len(self.arena), raw_reads=self.raw_reads)
        pending = []
        ctx: Any = contextlib.nullcontext()
        if plan.groups and stream is not None:
            import torch

            ctx = torch.cuda.stream(stream)
        with ctx:
            offs = [0, 0, 0]  # this batch's use of its buffers: upload and download bytes, result rows
            for g in plan.groups:
                pending.append((g, *self._group(g, stream, offs)))
            out = np.zeros((n, 3), dtype=np.int64) if plan.bad or plan.other or len(plan.groups) != 1 else None
            if plan.bad or plan.other:
                assert out is not None
                out[plan.bad] = (int(Codec.ZVC), ERR_CORRUPT, 0)
                if plan.other:
                    with clock.step("cpu"):
                        out[plan.other] = run_cpu_jobs(self.mv, [jobs[i] for i in plan.other])
            if self._cuda and plan.groups:
                with clock.step("download"):
                    self._wait()
        with clock.step("scatter"):
            for g, dst, rows, res in pending:
                if rows is not None:
                    self.stage.scatter(rows, dst, g.length)
                if out is None:  # one group of every job, in order: its results are the batch's
                    return cast(list[Result], list(map(tuple, res.tolist())))
                out[g.rows] = res
            assert out is not None
            return cast(list[Result], list(map(tuple, out.tolist())))

    def _step(self, op: int, length: int) -> Any:
        """The device step of ``op`` on blocks of ``length`` bytes, with its CRC bound (made once)."""
        step = self._steps.get((op, length))
        if step is None:
            from carina.infra.storage.crc import row_crc32

            crc = row_crc32(length, self.device) if self.device_crc else host_crc32
            step = functools.partial(_pack_step if op == Op.COMPRESS else _unpack_step, crc=crc)
            self._steps[(op, length)] = step
        return step

    def _group(self, g: Group, stream: Any, offs: list[int]) -> tuple[Any, Any, Any]:
        """Upload one group's rows, queue its kernels and its copies back.

        Returns ``(destinations, rows or None, results)``, the host arrays valid once :meth:`_wait`
        returns; rows are ``None`` when they were copied straight into the arena (CUDA, one run of
        back-to-back destinations).
        """
        clock = self.clock
        op, length, m = g.op, g.length, len(g.src)
        step = self._step(op, length)
        with clock.step("upload"):
            if op == Op.COMPRESS and g.src_run:  # one run: the rows are the arena's own bytes
                rows = self.host[int(g.src[0]) : int(g.src[0]) + m * length].view(m, length)
                args: tuple[Any, ...] = (rows.to(self.device, non_blocking=True),)
                self.copies += self._cuda
            else:  # rows (and, to decode, each job's codec, stored length and CRC) through this thread's staging
                nbytes = m * length + (24 * m if op == Op.DECOMPRESS else 0)
                key = ("up", op, length, m, offs[0])
                rows_np, meta_np, up, dev, args = self.stage.views(key, self._up_views, op, length, m, offs[0])
                offs[0] += nbytes
                self.stage.gather(rows_np, g.src, length, tail=g.tail)
                if meta_np is not None:
                    meta_np[:] = g.meta
                if dev is not up:  # one copy of rows and metadata to the device (on the CPU the rows are there)
                    dev.copy_(up, non_blocking=True)
                    self.copies += 1
        with clock.step("device"):
            name = "zvc-pack" if op == Op.COMPRESS else "zvc-unpack"
            blocks, res = self.graphs((name, length), step, args, stream=stream)
        with clock.step("download"):
            return (g.dst, *self._download(blocks, res, g.dst, g.dst_run, length, offs))

    def _up_views(self, op: int, length: int, m: int, off: int) -> tuple[Any, ...]:
        """Staging of ``m`` rows at byte ``off`` of this thread's upload buffer: host arrays, and the step's inputs."""
        import torch

        nbytes = m * length + (24 * m if op == Op.DECOMPRESS else 0)
        up = self.stage.buffer("up", off + nbytes, self.device)[off : off + nbytes]
        flat = up.numpy()
        rows = flat[: m * length].reshape(m, length)
        meta = flat[m * length :].view(np.int64) if op == Op.DECOMPRESS else None  # 3 per row, flat
        dev = up  # on the CPU the step reads the staging itself; on CUDA a region of one device buffer per thread
        if self._cuda:
            dev = self.stage.buffer("up-device", off + nbytes, self.device, on_device=True)[off : off + nbytes]
        args: tuple[Any, ...] = (dev[: m * length].view(m, length),)
        if op == Op.DECOMPRESS:
            args += (dev[m * length :].view(torch.int64).view(m, 3),)
        return rows, meta, up, dev, args

    def _download(self, blocks: Any, res: Any, dst: Any, run: bool, length: int, offs: list[int]) -> tuple[Any, Any]:
        """Queue the copies of ``blocks`` and ``res`` to the host (none on the CPU); their host arrays."""
        if not self._cuda:
            return blocks.numpy(), res.numpy()
        m = len(dst)
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
