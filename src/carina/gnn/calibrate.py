"""Measure the machine and the workload the cost model needs.

:func:`calibrate_machine` times, on this machine: 4 KiB random reads and 1 MiB
sequential reads through :mod:`carina.io` (vectorised gathers, as the feature store
reads; ``O_DIRECT`` where the file system allows it) on a scratch file, then random
reads of several pages each, which say whether the disk adds a request's cost to its
bytes or overlaps them (``MachineSpec.disk_cost``, :func:`pick_disk_cost`; the probe's
time is kept in the spec), host->device copies (pinned, or a host memcpy on a CPU-only
machine), scattered row gathers in host memory into a reused output (as the store
gathers into its staging), and on CUDA the GPU's gather of rows from pinned host memory
mapped into its address space, at two row sizes (``uva_gbps`` and ``uva_row_ns``), and the
static cache's lookup of a batch on the device (``lookup_*``: :func:`lookup_rates`). Pass
the :class:`~carina.io.IOConfig` the store will read with: the IOPS depend on the queue
depth.
:func:`profile_workload` samples batches to measure sampling and training time
per batch, unique nodes per batch and the hotness curve: nodes ranked on one
set of pre-sampled batches, hit shares counted on another, so the curve
predicts hits on batches the ranking has not seen.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from carina.gnn.costmodel import MachineSpec, WorkloadProfile
from carina.gnn.dataset import Dataset
from carina.gnn.diskcost import form_seconds
from carina.gnn.graph import node_features
from carina.gnn.runner import RunConfig, presample
from carina.gnn.sampler import NeighborSampler
from carina.gnn.train import GNN, train_step
from carina.io import FileHandle, IOConfig, IOEngine, aligned_buffer

__all__ = [
    "calibrate_machine",
    "hotness_curve",
    "line_fit",
    "lookup_rates",
    "pick_disk_cost",
    "profile_workload",
    "uva_fit",
]

_MB = 1 << 20


def calibrate_machine(
    scratch_dir: str | Path, *, size_mb: int = 256, device: str = "cpu", io: IOConfig | None = None
) -> MachineSpec:
    """Measure disk, copy and gather rates; the scratch file is removed afterwards."""
    path = Path(scratch_dir) / ".carina-gnn-calibrate.bin"
    try:
        iops, bw, probe = _disk(path, size_mb, io or IOConfig())
    finally:
        path.unlink(missing_ok=True)
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    gpu_gb = torch.cuda.get_device_properties(device).total_memory / 1e9 if cuda else 0.0
    host_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    gather, copy = _gather_rate(), _copy_rate(device)
    uva_bps, uva_row_s = _uva_rates(device) if cuda else (gather, 0.0)  # a CPU reads its host slice itself
    lookup = lookup_rates(device)
    return MachineSpec(
        name=name,
        gpu_mem_gb=gpu_gb,
        host_mem_gb=host_gb,
        ssd_count=1,
        ssd_read_gbps=bw / 1e9,
        ssd_iops=iops,
        pcie_gbps=copy / 1e9,
        host_gather_gbps=gather / 1e9,
        bus_limit_gbps=copy / 1e9 if cuda else 64.0,
        disk_cost=probe.form,
        uva_gbps=uva_bps / 1e9,
        uva_row_ns=uva_row_s * 1e9,
        disk_probe_pages=probe.pages,
        disk_probe_us=probe.seconds_per_read * 1e6,
        lookup_batch_us=lookup["batch_s"] * 1e6,
        lookup_id_ns=lookup["id_s"] * 1e9,
        lookup_host_id_ns=lookup["host_id_s"] * 1e9,
    )


@dataclass
class _Probe:
    """The disk-form probe: reads of ``pages`` pages each, their mean time at depth, the form picked."""

    form: str
    pages: int
    seconds_per_read: float


def _disk(path: Path, size_mb: int, io: IOConfig) -> tuple[float, float, _Probe]:
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
        probe = _disk_form(eng, h, size // 4096, iops, bw)
        eng.close_file(h)
    return iops, bw, probe


def _disk_form(eng: IOEngine, h: FileHandle, pages: int, iops: float, bw: float) -> _Probe:
    """The disk cost form that fits random reads of ``g`` pages (:func:`pick_disk_cost`).

    ``g`` is where a request's cost (``1 / IOPS``) equals its bytes', where the two forms differ most:
    additive over overlapped is ``2 - 1 / g`` there.
    """
    g = int(min(max(2, round(bw / (iops * 4096))), 64, pages // 2))
    reads = int(min(4096, (64 * _MB) // (g * 4096)))
    at = np.random.default_rng(2).integers(0, pages - g, reads) * 4096
    buf = aligned_buffer(g * 4096 * reads)
    t0 = time.perf_counter()
    eng.gather(h, at, g * 4096, buf, coalesce=False).result()
    took = time.perf_counter() - t0
    form = pick_disk_cost(took, reads=reads, pages_per_read=g, iops=iops, bandwidth=bw)
    return _Probe(form=form, pages=g, seconds_per_read=took / reads)


def pick_disk_cost(seconds: float, *, reads: int, pages_per_read: int, iops: float, bandwidth: float) -> str:
    """``"additive"`` or ``"overlapped"``, whichever prices the reads nearer (by ratio).

    ``reads`` reads of ``pages_per_read`` pages each took ``seconds``; the forms are
    :func:`carina.gnn.diskcost.form_seconds` (one page's transfer is part of ``1 / IOPS``).
    """
    pages = reads * pages_per_read
    additive = form_seconds("additive", reads, pages, iops=iops, ssd_bps=bandwidth)
    overlapped = form_seconds("overlapped", reads, pages, iops=iops, ssd_bps=bandwidth)
    return "additive" if abs(math.log(seconds / additive)) < abs(math.log(seconds / overlapped)) else "overlapped"


def _random_reads(eng: IOEngine, h: FileHandle, pages: int, reads: int = 65536) -> float:
    """4 KiB reads per second at random pages, through the gather path the feature store uses.

    The reads go to the engine as one vectorised gather (at the engine's queue depth), so
    the figure is the disk's, not the cost of making a Python request per read (which
    capped an earlier version of this measurement at ~15-19k reads/s). 65,536 reads (16,384
    until session 10, about 0.2 s on the H200, whose 74k then stood below the 72-104k IOs/s
    the benchmark's batches read at in the same lane).
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


def _gather_rate(rows: int = 1 << 19, dim: int = 128, batch: int = 1 << 16) -> float:
    """Bytes/s of gathering random 512 B rows of a 256 MB table into a reused output, as the store does.

    The store gathers its host hits into staging memory that is reused from batch to batch; a fresh
    output per call (what this measured until session 10) also timed the page faults of new memory:
    the H200's calibration said 4.26 GB/s while the IO thread's gathers in the same lane ran at
    7.9-8.4 GB/s and the host-gather peer's at 9.3-9.9 GB/s (``gnn_outofcore_*_h200_s9``).
    """
    x = torch.ones(rows, dim)
    idx = torch.randint(0, rows, (batch,), generator=torch.Generator().manual_seed(3))
    out = torch.empty(batch, dim)
    torch.index_select(x, 0, idx, out=out)  # faults the output in, warms the thread pool
    t0 = time.perf_counter()
    for _ in range(8):
        torch.index_select(x, 0, idx, out=out)
    return 8 * batch * dim * x.element_size() / (time.perf_counter() - t0)


def _uva_rates(device: str, *, table_mb: int = 256, batch: int = 1 << 16) -> tuple[float, float]:
    """The GPU gathering rows of pinned host memory in place: ``(bytes/s, seconds per row)``.

    Times ``batch`` random rows at 512 B and at 4 KiB from one pinned table mapped into the
    device (:func:`carina.memory.mapped.mapped_view`) and solves ``t = rows (row / B + t_row)``
    from the two (the GPU reads small rows at a lower rate: on the H200 the zero-copy peer reached
    about 22 GB/s with 512 B rows and 53 GB/s with 4 KiB rows, ``gnn_outofcore_*_h200_s9``).
    """
    from carina.memory.mapped import mapped_view

    host = torch.ones(table_mb * _MB, dtype=torch.uint8).pin_memory()
    times = {}
    for row in (512, 4096):
        table = host.view(-1, row)
        view = mapped_view(table, torch.device(device))
        idx = torch.randint(0, table.shape[0], (batch,), device=device)
        out = torch.empty(batch, row, dtype=torch.uint8, device=device)
        torch.index_select(view, 0, idx, out=out)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(4):
            torch.index_select(view, 0, idx, out=out)
        torch.cuda.synchronize(device)
        times[row] = (time.perf_counter() - t0) / 4 / batch  # seconds per row
    return uva_fit(times[512], times[4096])


def uva_fit(small_s: float, large_s: float, *, small: int = 512, large: int = 4096) -> tuple[float, float]:
    """``(bytes/s, seconds per row)`` of ``t(row) = row / B + t_row`` through two rows' times.

    A per-row time that would come out negative (the small rows relatively faster) is taken as 0
    and the rate from the large rows alone.
    """
    rate = (large - small) / (large_s - small_s) if large_s > small_s else large / large_s
    per_row = small_s - small / rate
    return (rate, per_row) if per_row >= 0 else (large / large_s, 0.0)


def lookup_rates(
    device: str, *, num_nodes: int = 1 << 22, small: int = 1 << 14, large: int = 1 << 18, repeats: int = 7
) -> dict[str, float]:
    """The static cache's lookup of one batch on ``device``: seconds a batch, per id, per host hit.

    A cache of ``num_nodes`` one-column rows, all in the host slice (pinned on CUDA), answers batches
    of ``small`` and ``large`` distinct random ids with the host hits' positions kept on the device
    (the ``device`` path); the line through the two medians gives the fixed part (the host reads'
    waits) and the part per id (:func:`line_fit`). The ``large`` batch looked up again with the
    positions and slots copied to the host (the ``cpu`` path) gives the cost per host hit of that copy.
    Each time is the CPU clock around the call, the device synchronised after it.
    """
    from carina.gnn.cache import CacheConfig, StaticCache

    cache = StaticCache(
        hotness=torch.zeros(num_nodes),
        config=CacheConfig(gpu_rows=0, host_rows=num_nodes),
        dim=1,
        dtype=torch.float32,
        device=device,
        fetch=lambda ids: torch.zeros(ids.numel(), 1),
    )
    gen = torch.Generator().manual_seed(4)
    batches = {n: torch.randperm(num_nodes, generator=gen)[:n].to(device) for n in (small, large)}

    def median_s(n: int, on_device: bool) -> float:
        times = []
        for _ in range(repeats + 1):  # the first call warms up (kernels, allocator): left out
            t0 = time.perf_counter()
            cache.lookup(batches[n], host_on_device=on_device)
            _sync(device)
            times.append(time.perf_counter() - t0)
        return float(np.median(times[1:]))

    batch_s, id_s = line_fit(small, median_s(small, True), large, median_s(large, True))
    host_id_s = max(0.0, median_s(large, False) - (batch_s + large * id_s)) / large
    return {"batch_s": batch_s, "id_s": id_s, "host_id_s": host_id_s}


def line_fit(x1: float, t1: float, x2: float, t2: float) -> tuple[float, float]:
    """``(fixed, per unit)`` of ``t = fixed + x per`` through two points, neither below 0.

    A fixed part that would come out negative is taken as 0 and the rate from the larger point alone;
    a falling line (``t2 < t1``) is all fixed: the larger point's time.
    """
    if t2 <= t1:
        return t2, 0.0
    per = (t2 - t1) / (x2 - x1)
    fixed = t1 - x1 * per
    return (fixed, per) if fixed >= 0 else (0.0, t2 / x2)


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
