"""The peers of ``bench_outofcore.py`` and how every system is measured.

* :class:`MmapFeatures`     PyG+-style fancy indexing into ``np.memmap`` (run cold: see :func:`carina.io.make_cold`)
* :class:`SyncReadFeatures` Ginex-like: carina's cache lookup, then one blocking ``O_DIRECT`` pread per missing row
* :class:`HostGather`       all features in pinned host memory, gathered and copied per batch
* :class:`ZeroCopy`         all features in pinned host memory mapped into the GPU's address space; the GPU
  gathers the rows itself over PCIe (UVA zero-copy, no CPU gather, no staging copy)
* :func:`generated_rows`    rows made from node ids on the device (the bytes of ``features.bin`` of a generated
  dataset), for the in-memory and host-gather systems and for filling caches without reading the file
* :func:`measure`           trains one system; seeds/s, losses, exact row checksums and, for generated datasets,
  whether every assembled batch equals the generator's rows bit for bit
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carina.gnn.dataset import PAGE, Dataset
from carina.gnn.graph import node_features
from carina.gnn.runner import RunConfig, train_once
from carina.gnn.sampler import NeighborSampler
from carina.gnn.store import OutOfCoreFeatures
from carina.memory.mapped import mapped_view

_CHUNK = 1 << 20


class TimeBox(Exception):
    """A peer's read passed its deadline inside a batch (its rate is then taken from rows read)."""


class RowClock:
    """Rows a slow peer read and the seconds it spent, with a deadline checked between chunks."""

    def __init__(self) -> None:
        self.rows, self.seconds, self.deadline = 0, 0.0, float("inf")

    def arm(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds if seconds else float("inf")

    def tick(self, rows: int, since: float) -> None:
        now = time.perf_counter()
        self.rows += rows
        self.seconds += now - since
        if now > self.deadline:
            raise TimeBox(f"{self.rows} rows in {self.seconds:.1f} s")


class MmapFeatures:
    """PyG+-style baseline: fancy indexing into a memory map of the feature file (64k rows at a time)."""

    def __init__(self, ds: Dataset, device: str) -> None:
        m = ds.manifest
        self.m, self.device = m, torch.device(device)
        self.rows = np.memmap(ds.features_path, dtype=np.uint8, mode="r", shape=(m.num_nodes, m.row_stride))
        self.clock = RowClock()

    def plan(self, n_id: torch.Tensor) -> torch.Tensor:
        return n_id.cpu()

    def read(self, plan: torch.Tensor) -> torch.Tensor:
        ids = plan.numpy()
        raw = np.empty((ids.size, self.m.row_bytes), dtype=np.uint8)
        for lo in range(0, ids.size, 1 << 16):
            t0 = time.perf_counter()
            raw[lo : lo + (1 << 16)] = self.rows[ids[lo : lo + (1 << 16)], : self.m.row_bytes]
            self.clock.tick(min(1 << 16, ids.size - lo), t0)
        return torch.from_numpy(raw).view(self.m.torch_dtype).reshape(-1, self.m.feature_dim)

    def assemble(self, plan: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
        return missing.to(self.device)


class SyncReadFeatures:
    """Ginex-like baseline: carina's cache lookup, then one blocking O_DIRECT pread per missing row."""

    def __init__(self, store: OutOfCoreFeatures, path: Path) -> None:
        self.store, self.m = store, store.manifest
        flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
        self.fd = os.open(path, flags)
        span = -(-self.m.row_stride // PAGE) * PAGE + PAGE
        self.buf = mmap.mmap(-1, span)  # page aligned
        self.reads = 0
        self.clock = RowClock()

    def plan(self, n_id: torch.Tensor) -> Any:
        return self.store.plan(n_id)

    def read(self, plan: Any) -> torch.Tensor:
        m, ids = self.m, plan.lookup.miss_ids.tolist()
        out = torch.empty(len(ids), m.row_bytes, dtype=torch.uint8)
        view = memoryview(self.buf)
        t0 = time.perf_counter()
        for i, v in enumerate(ids):
            off = v * m.row_stride
            first = off // PAGE * PAGE
            n = -(-(off + m.row_bytes - first) // PAGE) * PAGE
            os.preadv(self.fd, [view[:n]], first)
            lo = off - first
            out[i] = torch.frombuffer(self.buf, dtype=torch.uint8, count=m.row_bytes, offset=lo)
            self.reads += 1
            if i % 4096 == 4095:
                self.clock.tick(4096, t0)
                t0 = time.perf_counter()
        self.clock.tick(len(ids) % 4096, t0)
        return out.view(m.torch_dtype).reshape(len(ids), m.feature_dim)

    def assemble(self, plan: Any, missing: torch.Tensor) -> torch.Tensor:
        return self.store.assemble(plan, missing)

    def close(self) -> None:
        os.close(self.fd)


class HostGather:
    """S1: features in (pinned) host memory; a CPU gather and a copy to the device per batch."""

    def __init__(self, host: torch.Tensor, device: str) -> None:
        self.host, self.device = host, device

    def plan(self, n_id: torch.Tensor) -> torch.Tensor:
        return n_id.cpu()

    def read(self, plan: torch.Tensor) -> torch.Tensor:
        return self.host.index_select(0, plan)

    def assemble(self, plan: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
        return missing.to(self.device, non_blocking=True)


class ZeroCopy:
    """S1b: the GPU gathers rows straight from pinned host memory (UVA zero-copy, as DGL's UVA sampling).

    Pinned memory from ``cudaHostAlloc`` is mapped into every device's address space at the same
    address under unified addressing, so a CUDA tensor over the host pointer
    (:func:`carina.memory.mapped.mapped_view`) is read by ``index_select``'s kernel across PCIe,
    row by row. carina's store serves its host-cache slice the same way (``host_gather="device"``).
    """

    def __init__(self, host: torch.Tensor, device: str) -> None:
        if not device.startswith("cuda") or not host.is_pinned():
            raise ValueError("zero-copy needs a CUDA device and pinned host memory")
        self.host, self.device = host, torch.device(device)
        self.view = mapped_view(host, self.device)

    def plan(self, n_id: torch.Tensor) -> torch.Tensor:
        return n_id.to(self.device, non_blocking=True)

    def read(self, plan: torch.Tensor) -> torch.Tensor:
        return torch.empty(0)

    def assemble(self, plan: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
        return self.view.index_select(0, plan)


def generated_rows(ds: Dataset, ids: torch.Tensor, device: str) -> torch.Tensor:
    """Rows of ``ids`` from the generator, made on ``device`` (a generated dataset's file holds these bytes)."""
    m = ds.manifest
    return node_features(ids.to(device), dim=m.feature_dim, seed=m.feature_seed or 0, dtype=m.torch_dtype)


def generated_table(ds: Dataset, device: str, *, out_device: str | None = None, pin: bool = False) -> torch.Tensor:
    """Every row, made on ``device`` in chunks and stored on ``out_device`` (pinned host if ``pin``)."""
    m = ds.manifest
    where = out_device or device
    out = torch.empty(m.num_nodes, m.feature_dim, dtype=m.torch_dtype, device=where, pin_memory=pin)
    for lo in range(0, m.num_nodes, _CHUNK):
        hi = min(m.num_nodes, lo + _CHUNK)
        out[lo:hi].copy_(generated_rows(ds, torch.arange(lo, hi), device))
    return out


def generator_fetch(ds: Dataset, device: str) -> Any:
    """A cache-fill function (ids -> rows on ``device``) from the generator instead of the file.

    The rows stay on the device: the cache copies them into its pinned host slice by DMA (session 8
    spent 52 s filling 34 GB at 100% cache through a pageable ``.cpu()`` copy and a second memcpy).
    """
    return lambda ids: generated_rows(ds, ids, device)


class Checksummed:
    """Wraps a source; records an exact checksum of every assembled batch and, if asked, checks the
    first :attr:`VERIFIED` batches against the generator bit for bit (not every batch: the check
    runs inside the timed pipeline)."""

    VERIFIED = 2

    def __init__(self, source: Any, verify: Dataset | None = None) -> None:
        self.source, self.sums, self.verify, self.exact = source, [], verify, True
        self.check_calls: list[float] = []  # seconds the checks took inside each timed assemble (subtracted)

    @property
    def check_s(self) -> float:
        return sum(self.check_calls)

    def plan(self, n_id: torch.Tensor) -> Any:
        return n_id, self.source.plan(n_id)

    def read(self, plan: Any) -> torch.Tensor:
        return self.source.read(plan[1])

    def assemble(self, plan: Any, missing: torch.Tensor) -> torch.Tensor:
        x = self.source.assemble(plan[1], missing)
        t0 = time.perf_counter()
        self.sums.append(int(x.contiguous().view(torch.int32).to(torch.int64).sum()))
        if self.verify is not None and len(self.sums) <= self.VERIFIED:  # the first batches only: cheap
            self.exact &= bool(torch.equal(x, generated_rows(self.verify, plan[0], str(x.device))))
        self.check_calls.append(time.perf_counter() - t0)
        return x


WARM_SEED_OFFSET = 1000  # the warm-up read's batches: none of the timed systems' (seed, seed + peer offset)


def warm_read(ds: Dataset, cfg: RunConfig, engine: Any, batches: int) -> dict[str, Any]:
    """Read ``batches`` batches' features from the file before any timed system (no system's clock runs).

    Every row of each batch is read (no cache), with the IO engine the systems use; the batches are
    sampled with a seed of their own (``seed + WARM_SEED_OFFSET``), so the disk (and any cache below it)
    has not seen the timed systems' rows: what the first timed system gains is the disk's ramp, not its
    rows read twice.
    """
    store = OutOfCoreFeatures(ds, engine=engine, device=cfg.device)
    seed = cfg.train.seed + WARM_SEED_OFFSET
    sampler = NeighborSampler(ds.graph, fanouts=cfg.train.fanouts, device=cfg.device, seed=seed)
    done = rows = 0
    t0 = time.perf_counter()
    try:
        for batch in sampler.batches(ds.train_idx, cfg.train.batch_size):
            if done >= batches:
                break
            rows += int(store.read_rows(batch.n_id).shape[0])
            done += 1
    finally:
        store.close()
    return {"batches": done, "rows": rows, "seconds": time.perf_counter() - t0, "seed": seed}


def _mean_ms(calls: list[float] | None, warmup: int) -> float | None:
    if not calls:
        return None
    kept = calls[warmup:] or calls
    return 1e3 * sum(kept) / len(kept)


def sampler_ms(cpu: dict[str, list[float]], device: dict[str, list[float]], warmup: int) -> dict[str, float | None]:
    """The sampler thread's milliseconds a batch, warm-up calls left out: its sample and cache lookup
    (``plan``) on the CPU's clock (around queued work) and on the device's (CUDA events on the sampler's
    own stream; None without one: on the CPU, or with the sampler on the device's stream)."""
    return {
        "sample_cpu_ms": _mean_ms(cpu.get("sample"), warmup),
        "lookup_cpu_ms": _mean_ms(cpu.get("plan"), warmup),
        "sample_device_ms": _mean_ms(device.get("sample"), warmup),
        "lookup_device_ms": _mean_ms(device.get("plan"), warmup),
    }


def measure_boxed(ds: Dataset, cfg: RunConfig, source: Any, warmup: int, rows_per_batch: float) -> dict[str, Any]:
    """:func:`measure` for a slow peer with a ``clock``.

    The epoch stops after the batch that crosses ``time_limit_s``; a read still running at 1.5x
    the limit is stopped, and the rate is then extrapolated from the rows read per second and the
    rows a batch reads (``rows_per_batch``; ``rate_basis`` says so).
    """
    source.clock.arm(1.5 * cfg.train.time_limit_s)
    try:
        return measure(ds, cfg, source, warmup, verify=True)
    except TimeBox as stop:
        c = source.clock
        rows_per_s = c.rows / c.seconds if c.seconds else 0.0
        batch_s = rows_per_batch / rows_per_s if rows_per_s else float("inf")
        return {
            "seeds_per_s": cfg.train.batch_size / batch_s if rows_per_s else 0.0,
            "rate_basis": f"extrapolated: no batch finished in the time box ({stop}); "
            f"{rows_per_batch:.0f} rows per batch at {rows_per_s:.0f} rows/s",
            "batches": 0,
            "rows_read": c.rows,
            "read_s": c.seconds,
            "losses": [],
            "row_checksums": [],
        }


def measure(ds: Dataset, cfg: RunConfig, source: Any, warmup: int, *, verify: bool = False) -> dict[str, Any]:
    """Train up to ``warmup + measured`` batches (or ``time_limit_s``); seeds/s over the measured ones.

    With too few batches to leave ``warmup`` out (a time-boxed run on a slow path), the rate is
    taken over every batch from the start of the epoch, pipeline fill included (``rate_basis``).
    """
    stamps: list[float] = []
    src = Checksummed(source, ds if verify and ds.manifest.feature_seed is not None else None)
    t_begin = time.perf_counter()
    res = train_once(ds, cfg, src, on_batch=lambda i, loss: stamps.append(time.perf_counter()))
    if len(stamps) >= warmup + 2:
        n, dt, basis = len(stamps) - warmup - 1, stamps[-1] - stamps[warmup], f"after {warmup} warm-up batches"
    else:
        n, dt, basis = len(stamps), (stamps[-1] - t_begin) if stamps else 0.0, "from the epoch start"
    out = {
        "seeds_per_s": n * cfg.train.batch_size / dt if dt > 0 else 0.0,
        "rate_basis": basis,
        "batches": len(stamps),
        "losses": res.losses,
        "row_checksums": src.sums,
        "stage_s": res.stage_s,
        "stage_n": res.stage_n,
        "train_s": res.train_s,
        "check_s": src.check_s,
        "max_in_flight": res.max_in_flight,
        "warmup": warmup,
        "calls": {
            **res.stage_calls,
            "train": res.train_calls,
            "check": src.check_calls,
            **{f"{k}_device": v for k, v in res.device_calls.items()},
        },
    } | sampler_ms(res.stage_calls, res.device_calls, warmup)
    if src.verify is not None:
        out["rows_exact_vs_generator"] = src.exact
    return out
