"""Measure the machine and the workload the cost model needs.

:func:`calibrate_machine` times, on this machine: 4 KiB random reads and 1 MiB
sequential reads through :mod:`carina.io` (vectorised gathers, as the feature store
reads; ``O_DIRECT`` where the file system allows it) on a scratch file, then random
reads of several pages each, which say whether the disk adds a request's cost to its
bytes or overlaps them (``MachineSpec.disk_cost``, :func:`pick_disk_cost`),
host->device copies (pinned, or a host memcpy on a CPU-only machine) and
scattered row gathers in host memory. Pass the :class:`~carina.io.IOConfig` the
store will read with: the IOPS depend on the queue depth.
:func:`profile_workload` samples batches to measure sampling and training time
per batch, unique nodes per batch and the hotness curve: nodes ranked on one
set of pre-sampled batches, hit shares counted on another, so the curve
predicts hits on batches the ranking has not seen.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from carina.gnn.costmodel import MachineSpec, WorkloadProfile
from carina.gnn.dataset import Dataset
from carina.gnn.graph import node_features
from carina.gnn.runner import RunConfig, presample
from carina.gnn.sampler import NeighborSampler
from carina.gnn.train import GNN, train_step
from carina.io import FileHandle, IOConfig, IOEngine, aligned_buffer

__all__ = ["calibrate_machine", "hotness_curve", "pick_disk_cost", "profile_workload"]

_MB = 1 << 20


def calibrate_machine(
    scratch_dir: str | Path, *, size_mb: int = 256, device: str = "cpu", io: IOConfig | None = None
) -> MachineSpec:
    """Measure disk, copy and gather rates; the scratch file is removed afterwards."""
    path = Path(scratch_dir) / ".carina-gnn-calibrate.bin"
    try:
        iops, bw, form = _disk(path, size_mb, io or IOConfig())
    finally:
        path.unlink(missing_ok=True)
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    gpu_gb = torch.cuda.get_device_properties(device).total_memory / 1e9 if cuda else 0.0
    host_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return MachineSpec(
        name=name,
        gpu_mem_gb=gpu_gb,
        host_mem_gb=host_gb,
        ssd_count=1,
        ssd_read_gbps=bw / 1e9,
        ssd_iops=iops,
        pcie_gbps=_copy_rate(device) / 1e9,
        host_gather_gbps=_gather_rate() / 1e9,
        bus_limit_gbps=_copy_rate(device) / 1e9 if device.startswith("cuda") else 64.0,
        disk_cost=form,
    )


def _disk(path: Path, size_mb: int, io: IOConfig) -> tuple[float, float, str]:
    size = size_mb * _MB
    with path.open("wb") as f:
        chunk = np.random.default_rng(0).integers(0, 255, _MB, dtype=np.uint8).tobytes()
        for _ in range(size_mb):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    with IOEngine(io) as eng:
        h = eng.open(str(path), "r")
        iops = _random_reads(eng, h, size // 4096)
        per = min(16, size_mb)  # 1 MiB reads, `per` in flight
        big = aligned_buffer(_MB * per)
        t0 = time.perf_counter()
        for off in range(0, size - per * _MB + 1, per * _MB):
            eng.gather(h, off + _MB * np.arange(per), _MB, big, coalesce=False).result()
        bw = size / (time.perf_counter() - t0)
        form = _disk_form(eng, h, size // 4096, iops, bw)
        eng.close_file(h)
    return iops, bw, form


def _disk_form(eng: IOEngine, h: FileHandle, pages: int, iops: float, bw: float) -> str:
    """The disk cost form that fits random reads of ``g`` pages (:func:`pick_disk_cost`).

    ``g`` is where a request's cost equals its bytes', so the two forms differ by 2x there.
    """
    g = int(min(max(2, round(bw / (iops * 4096))), 64, pages // 2))
    reads = int(min(4096, (64 * _MB) // (g * 4096)))
    at = np.random.default_rng(2).integers(0, pages - g, reads) * 4096
    buf = aligned_buffer(g * 4096 * reads)
    t0 = time.perf_counter()
    eng.gather(h, at, g * 4096, buf, coalesce=False).result()
    return pick_disk_cost(time.perf_counter() - t0, reads=reads, pages_per_read=g, iops=iops, bandwidth=bw)


def pick_disk_cost(seconds: float, *, reads: int, pages_per_read: int, iops: float, bandwidth: float) -> str:
    """``"additive"`` or ``"overlapped"``, whichever prices the reads nearer (by ratio).

    ``reads`` reads of ``pages_per_read`` pages each took ``seconds``.
    """
    per_request, transfer = reads / iops, reads * pages_per_read * 4096 / bandwidth
    additive, overlapped = per_request + transfer, max(per_request, transfer)
    return "additive" if abs(math.log(seconds / additive)) < abs(math.log(seconds / overlapped)) else "overlapped"


def _random_reads(eng: IOEngine, h: FileHandle, pages: int, reads: int = 16384) -> float:
    """4 KiB reads per second at random pages, through the gather path the feature store uses.

    The reads go to the engine as one vectorised gather (at the engine's queue depth), so
    the figure is the disk's, not the cost of making a Python request per read (which
    capped an earlier version of this measurement at ~15-19k reads/s).
    """
    at = np.random.default_rng(1).integers(0, pages, reads) * 4096
    buf = aligned_buffer(4096 * reads)
    eng.gather(h, at[:256], 4096, buf, coalesce=False).result()  # warm the path (threads, ring)
    t0 = time.perf_counter()
    eng.gather(h, at, 4096, buf, coalesce=False).result()
    return reads / (time.perf_counter() - t0)


def _copy_rate(device: str) -> float:
    n = 64 * _MB
    if device.startswith("cuda"):
        src = torch.empty(n, dtype=torch.uint8).pin_memory()
        dst = torch.empty(n, dtype=torch.uint8, device=device)
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(8):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        return 8 * n / (time.perf_counter() - t0)
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(4):
        dst.copy_(src)
    return 4 * n / (time.perf_counter() - t0)


def _gather_rate() -> float:
    x = torch.randn(1 << 18, 128)
    idx = torch.randint(0, x.shape[0], (1 << 16,))
    x.index_select(0, idx)
    t0 = time.perf_counter()
    for _ in range(8):
        x.index_select(0, idx)
    return 8 * idx.numel() * 128 * 4 / (time.perf_counter() - t0)


def hotness_curve(
    rank_by: list[torch.Tensor], count_on: list[torch.Tensor], num_nodes: int, points: int = 101
) -> list[float]:
    """Share of accesses in ``count_on`` served by the top fraction of nodes ranked on ``rank_by``."""
    rank = torch.zeros(num_nodes)
    for n_id in rank_by:
        rank += torch.bincount(n_id, minlength=num_nodes).to(torch.float32)
    hits = torch.zeros(num_nodes, dtype=torch.float64)
    for n_id in count_on:
        hits += torch.bincount(n_id, minlength=num_nodes).to(torch.float64)
    order = torch.sort(rank, descending=True, stable=True).indices
    cum = torch.cumsum(hits[order], 0)
    total = float(cum[-1]) or 1.0
    at = [round(i * num_nodes / (points - 1)) for i in range(points)]
    return [0.0] + [float(cum[max(a, 1) - 1]) / total for a in at[1:]]


def profile_workload(dataset: Dataset, cfg: RunConfig, *, batches: int = 8) -> WorkloadProfile:
    """Sample and train ``batches`` batches (in memory) to measure the workload."""
    m = dataset.manifest
    tc = cfg.train
    sampler = NeighborSampler(dataset.graph, fanouts=tc.fanouts, device=cfg.device, seed=tc.seed)
    measured, t_sample, t_first = [], 0.0, 0.0
    it = sampler.batches(dataset.train_idx, tc.batch_size)
    for i in range(batches):
        t0 = time.perf_counter()
        b = next(it, None)
        if b is None:
            break
        _sync(cfg.device)
        dt = time.perf_counter() - t0
        # the first batch warms up the sampler (graph to the device, kernels): left out, as compute's first step
        t_sample += dt if i > 0 else 0.0
        t_first = dt if i == 0 else t_first
        measured.append(b)
    torch.manual_seed(tc.seed)
    model = GNN(tc.model, m.feature_dim, tc.hidden, m.num_classes, len(tc.fanouts)).to(cfg.device)
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
    labels = dataset.labels.to(cfg.device)
    t_compute = 0.0
    for i, b in enumerate(measured):
        x = node_features(b.n_id, dim=m.feature_dim, seed=m.feature_seed or 0, dtype=m.torch_dtype)
        _sync(cfg.device)
        t0 = time.perf_counter()
        train_step(model, opt, b, x.to(cfg.device), labels)
        _sync(cfg.device)
        if i > 0 or len(measured) == 1:  # the first step warms up kernels
            t_compute += time.perf_counter() - t0
    n_ids = [b.n_id.cpu() for b in measured]
    return WorkloadProfile(
        num_nodes=m.num_nodes,
        row_bytes=m.row_bytes,
        row_stride=m.row_stride,
        batch_size=tc.batch_size,
        batches_per_epoch=-(-dataset.train_idx.numel() // tc.batch_size),
        unique_per_batch=float(np.mean([n.numel() for n in n_ids])),
        sample_s=t_sample / (len(measured) - 1) if len(measured) > 1 else t_first,
        compute_s=t_compute / max(1, len(measured) - 1),
        hotness_curve=hotness_curve(presample(dataset, cfg), n_ids, m.num_nodes),
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
