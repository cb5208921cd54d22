"""Out-of-core node features: static cache, then coalesced page reads through carina.io.

A batch's rows are served in three steps, split so a pipeline can run them on
different threads:

1. :meth:`OutOfCoreFeatures.plan` looks every node up in the static cache (one
   gather on the sampling device) and turns the misses into sorted, deduplicated
   4 KiB pages grouped into runs of consecutive pages (vectorised, numpy).
2. :meth:`OutOfCoreFeatures.read` hands all runs of a batch to one
   :meth:`carina.io.IOEngine.gather` (one read per run, ``O_DIRECT`` where
   allowed, offsets and lengths as arrays), waits, and cuts the rows out of the
   page buffer. One gather, not one ``read_batch`` request (a Python future,
   view and transfer) per run: that per-request work capped the store at about
   15-19k requests/s on one core, below the 90k IOPS the H200's disk serves,
   and it was what the calibration measured as the disk's IOPS. On the ``cpu``
   host path the same stage gathers the host-cache hits
   (:attr:`FetchPlan.host_rows`), so that CPU work runs on the IO thread, not on
   the training thread.
3. :meth:`OutOfCoreFeatures.assemble` writes GPU hits, host hits and read rows
   into one device tensor in batch order; on the ``device`` host path the device
   gathers the host hits here, from the host slice read in place
   (:mod:`carina.gnn.hostpath`).

Rows bound for a CUDA device are staged in pinned memory and copied without
blocking. Session 8 on the H200 measured what pageable staging cost: at 100%
cache (no disk) the training thread's assemble took 27 ms per [25,10] @ 8000
batch for 55 MB of host hits (a CPU gather, then a synchronous pageable copy
that also waits for the GPU work queued ahead), where the model priced 5.5 ms,
and carina ran at 0.41x in-memory (``gnn_outofcore_papers_25x10_h200``).

Counters (:class:`FetchStats`) record hits per tier, pages, IOs and bytes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from carina.core.config import Config, require
from carina.core.errors import ConfigError
from carina.gnn import hostread
from carina.gnn.cache import CacheLookup, StaticCache
from carina.gnn.dataset import PAGE, Dataset
from carina.gnn.hostpath import HostGather, resolve

__all__ = ["FetchPlan", "FetchStats", "OutOfCoreFeatures", "PageRuns", "StoreConfig", "page_runs"]


@dataclass(kw_only=True)
class StoreConfig(Config):
    """Page-read policy of the out-of-core store.

    Attributes:
        gap_pages: Merge runs separated by at most this many unneeded pages
            (read and discarded: fewer, larger IOs for more bytes).
        max_run_pages: Largest run in pages (one IO).
        host_gather: Who gathers the host-cache hits: ``cpu`` (the IO thread, into staging),
            ``device`` (the compute device, from the host slice read in place) or ``auto``
            (``device`` on CUDA with a pinned slice, else ``cpu``); see :mod:`carina.gnn.hostpath`.
    """

    gap_pages: int = 0
    max_run_pages: int = 64
    host_gather: HostGather = HostGather.AUTO

    def validate(self) -> None:
        """Check ranges."""
        require(self.gap_pages >= 0, "gap_pages must be >= 0", key="gap_pages")
        require(self.max_run_pages >= 1, "max_run_pages must be >= 1", key="max_run_pages")


@dataclass
class PageRuns:
    """Runs of pages to read and where each needed page lands in the buffer.

    Attributes:
        run_first: First page of each run.
        run_pages: Pages in each run (gaps included).
        run_buf: Buffer offset (in pages) of each run.
        total_pages: Pages read in all (the buffer size in pages).
    """

    run_first: np.ndarray
    run_pages: np.ndarray
    run_buf: np.ndarray
    total_pages: int

    def buffer_page(self, pages: np.ndarray) -> np.ndarray:
        """Buffer page index of each (needed) page."""
        r = np.searchsorted(self.run_first, pages, side="right") - 1
        return self.run_buf[r] + (pages - self.run_first[r])


def page_runs(pages: np.ndarray, *, gap_pages: int = 0, max_run_pages: int = 64) -> PageRuns:
    """Group sorted unique page numbers into runs of at most ``max_run_pages``."""
    if pages.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return PageRuns(empty, empty, empty, 0)
    breaks = np.flatnonzero(np.diff(pages) > gap_pages + 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [pages.size]])
    lo, hi = pages[starts].astype(np.int64), pages[ends - 1].astype(np.int64) + 1
    pieces = -(-(hi - lo) // max_run_pages)  # a run longer than max_run_pages is cut (vectorised: no loop per run)
    piece = np.arange(int(pieces.sum()), dtype=np.int64) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    first = np.repeat(lo, pieces) + piece * max_run_pages
    n = np.minimum(max_run_pages, np.repeat(hi, pieces) - first)
    buf = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    return PageRuns(first, n, buf, int(n.sum()))


@dataclass
class FetchPlan:
    """What one batch needs: cache hits by tier and the page runs of the misses."""

    n_id: torch.Tensor
    lookup: CacheLookup
    runs: PageRuns
    row_page: np.ndarray  # first page of each missing row
    host_rows: torch.Tensor | None = None  # host-cache hits gathered by the read stage (cpu path; None: not yet)


@dataclass
class FetchStats:
    """Counters over every batch fetched so far."""

    rows: int = 0
    gpu_hits: int = 0
    host_hits: int = 0
    misses: int = 0
    pages: int = 0
    ios: int = 0
    bytes_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        """Add to counters (thread-safe)."""
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self, row_bytes: int) -> dict[str, float]:
        """Counters plus hit rate and read amplification."""
        d: dict[str, float] = {k: getattr(self, k) for k in ("rows", "gpu_hits", "host_hits", "misses")}
        d.update(pages=self.pages, ios=self.ios, bytes_read=self.bytes_read)
        d["hit_rate"] = (self.gpu_hits + self.host_hits) / self.rows if self.rows else 0.0
        d["amplification"] = self.bytes_read / (self.misses * row_bytes) if self.misses else 0.0
        return d


class OutOfCoreFeatures:
    """Features of a :class:`Dataset` served from a static cache and its file.

    Args:
        dataset: The opened dataset (its ``features.bin`` is read).
        engine: An open :class:`carina.io.IOEngine`.
        device: Where assembled batches go.
        cache: The static cache (``None``: every row comes from disk).
        config: Page-read policy.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        engine: Any,
        device: str | torch.device = "cpu",
        cache: StaticCache | None = None,
        config: StoreConfig | None = None,
    ) -> None:
        self.manifest = dataset.manifest
        self.device = torch.device(device)
        self.engine = engine
        self.config = config or StoreConfig()
        self.handle = engine.open(str(dataset.features_path), "r")
        self.cache: StaticCache | None = None
        self._host_view: torch.Tensor | None = None  # the host slice as the device reads it (device path)
        self.attach_cache(cache)
        self.stats = FetchStats()
        self.dim = self.manifest.feature_dim
        self.dtype = self.manifest.torch_dtype
        self._spare: np.ndarray | None = None  # one page buffer kept between batches
        self._spare_lock = threading.Lock()
        # staged rows go to the device from pinned memory: an asynchronous copy at the bus's rate
        self._pin = self.device.type == "cuda" and torch.cuda.is_available()

    def attach_cache(self, cache: StaticCache | None) -> None:
        """Use ``cache`` (built with :meth:`read_rows` as its fetch function); resolves the host path.

        Raises:
            BackendUnavailable: ``host_gather="device"`` and the host slice cannot be read in place.
        """
        self.cache = cache
        host = cache.host if cache is not None else None
        self._host_view = resolve(self.config.host_gather, host, self.device)

    @property
    def host_path(self) -> HostGather:
        """Who gathers the host-cache hits, as resolved for the attached cache: ``cpu`` or ``device``."""
        return HostGather.CPU if self._host_view is None else HostGather.DEVICE

    def close(self) -> None:
        """Close the feature file (the engine stays open) and drop the spare page buffer."""
        self.engine.close_file(self.handle)
        self._spare = None

    # -- stage 1 ----------------------------------------------------------------
    def plan(self, n_id: torch.Tensor) -> FetchPlan:
        """Look ``n_id`` up in the cache and plan the page reads of the misses."""
        lookup = self._lookup(n_id)
        ids = lookup.miss_ids.numpy()
        stride = self.manifest.row_stride
        first = ids * stride // PAGE
        last = (ids * stride + stride - 1) // PAGE
        span = int((last - first).max()) + 1 if ids.size else 1
        need = first if span == 1 else (first[:, None] + np.arange(span)).reshape(-1)
        pages = _sorted_unique(need)
        runs = page_runs(pages, gap_pages=self.config.gap_pages, max_run_pages=self.config.max_run_pages)
        return FetchPlan(n_id=n_id, lookup=lookup, runs=runs, row_page=first)

    def _lookup(self, n_id: torch.Tensor) -> CacheLookup:
        if self.cache is not None:
            return self.cache.lookup(n_id, host_on_device=self.host_path is HostGather.DEVICE)
        # every row misses: the ids sorted where they are, one copy of them to the CPU (no order copied back)
        empty = torch.zeros(0, dtype=torch.int64)
        ids, order = torch.sort(n_id, stable=True)
        return CacheLookup(
            gpu_pos=torch.zeros(0, dtype=torch.int64, device=n_id.device),
            gpu_slot=torch.zeros(0, dtype=torch.int64, device=n_id.device),
            host_pos=empty,
            host_slot=empty,
            miss_pos=order,
            miss_ids=hostread.to_host(ids),
        )

    # -- stage 2 ----------------------------------------------------------------
    def read(self, plan: FetchPlan, *, count: bool = True) -> torch.Tensor:
        """Read the missing rows of ``plan`` (CPU tensor, in ``miss_ids`` order).

        On the ``cpu`` host path also gathers the plan's host-cache hits into
        :attr:`FetchPlan.host_rows` (this is the pipeline's IO thread). ``count=False`` leaves
        :attr:`stats` alone (cache filling).
        """
        self.stage_host_rows(plan)
        runs = plan.runs
        full = self._take_buffer(max(runs.total_pages, 1) * PAGE)
        buf = full[: max(runs.total_pages, 1) * PAGE]
        try:
            if runs.run_first.size:  # one vectorised gather: no Python object per run (see module doc)
                offsets, lengths = runs.run_first * PAGE, runs.run_pages * PAGE
                self.engine.gather(self.handle, offsets, lengths, buf, coalesce=False).result()
            m = self.manifest
            if count:
                self._count(plan, int(runs.run_first.size))
            return _cut_rows(buf, runs, plan, m.row_stride, m.row_bytes, self._staging(plan.lookup.miss_ids.numel()))
        finally:  # the rows are copied out: the page buffer serves the next batch
            self._give_back(full)

    def stage_host_rows(self, plan: FetchPlan) -> None:
        """Gather the plan's host-cache hits into (pinned, on CUDA) staging memory, once (``cpu`` path)."""
        lk = plan.lookup
        if plan.host_rows is not None or self.cache is None or not lk.host_pos.numel():
            return
        if self.host_path is HostGather.DEVICE:
            return
        out = self._staging(lk.host_slot.numel())
        plan.host_rows = torch.index_select(self.cache.host, 0, lk.host_slot, out=out)

    def _staging(self, rows: int) -> torch.Tensor:
        """A CPU tensor of ``rows`` rows, pinned when batches go to a CUDA device."""
        return torch.empty(rows, self.dim, dtype=self.dtype, pin_memory=self._pin)

    def _take_buffer(self, nbytes: int) -> np.ndarray:
        """The spare page buffer if it is large enough (no fresh pages to fault in), else a new one."""
        from carina.io import aligned_buffer

        with self._spare_lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.nbytes >= nbytes:
            return spare
        return aligned_buffer(nbytes)

    def _give_back(self, buf: np.ndarray) -> None:
        with self._spare_lock:
            if self._spare is None or buf.nbytes > self._spare.nbytes:
                self._spare = buf

    def _count(self, plan: FetchPlan, ios: int) -> None:
        runs = plan.runs
        self.stats.add(
            rows=plan.n_id.numel(),
            gpu_hits=plan.lookup.gpu_pos.numel(),
            host_hits=plan.lookup.host_pos.numel(),
            misses=plan.lookup.miss_ids.numel(),
            pages=runs.total_pages,
            ios=ios,
            bytes_read=runs.total_pages * PAGE,
        )

    # -- stage 3 ----------------------------------------------------------------
    def assemble(self, plan: FetchPlan, missing: torch.Tensor) -> torch.Tensor:
        """One ``[len(n_id), dim]`` tensor on the device, in ``n_id`` order."""
        lk = plan.lookup
        out = torch.empty(plan.n_id.numel(), self.dim, dtype=self.dtype, device=self.device)
        if self.cache is not None and lk.gpu_pos.numel():
            out[lk.gpu_pos.to(self.device)] = self.cache.gpu[lk.gpu_slot.to(self.device)]
        if self.cache is not None and lk.host_pos.numel():
            out[lk.host_pos.to(self.device)] = self._host_hits(plan)
        if missing.numel():
            out[lk.miss_pos.to(self.device)] = missing.to(self.device, non_blocking=True)
        return out

    def _host_hits(self, plan: FetchPlan) -> torch.Tensor:
        """The plan's host-cache hits on the device: gathered there (``device``) or copied from staging."""
        lk = plan.lookup
        if self._host_view is not None:  # the device path
            return self._host_view.index_select(0, lk.host_slot.to(self._host_view.device))
        self.stage_host_rows(plan)  # a no-op after read(): the IO thread staged them
        assert plan.host_rows is not None
        return plan.host_rows.to(self.device, non_blocking=True)

    def gather(self, n_id: torch.Tensor) -> torch.Tensor:
        """All three stages at once: rows of ``n_id`` on the device."""
        plan = self.plan(n_id)
        return self.assemble(plan, self.read(plan))

    def read_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids`` straight from disk (CPU, in ``ids`` order); fills caches."""
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.manifest.num_nodes):
            raise ConfigError(f"node ids must lie in [0, {self.manifest.num_nodes})", key="index")
        saved, self.cache = self.cache, None
        try:
            plan = self.plan(ids.cpu())
            rows = self.read(plan, count=False)
        finally:
            self.cache = saved
        out = torch.empty_like(rows)
        out[plan.lookup.miss_pos] = rows
        return out


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """Distinct values of an array that is already non-decreasing (miss ids come sorted), in O(n).

    ``np.unique`` sorts (or, in NumPy 2.x, hashes) whatever it gets: ~3 s for the 1.7M pages of a
    [25,10] @ 8000 batch on the CPU machine, against milliseconds here. Unsorted input falls back
    to it.
    """
    if values.size < 2:
        return values.copy()
    step = values[1:] != values[:-1]
    if not (values[1:] >= values[:-1]).all():
        return np.unique(values)
    return values[np.concatenate(([True], step))]


def _cut_rows(
    buf: np.ndarray, runs: PageRuns, plan: FetchPlan, stride: int, row_bytes: int, out: torch.Tensor
) -> torch.Tensor:
    """The missing rows cut out of the page buffer into ``out`` (``[misses, dim]``, staging memory)."""
    ids = plan.lookup.miss_ids.numpy()
    if ids.size == 0:
        return out
    start = runs.buffer_page(plan.row_page) * PAGE + (ids * stride) % PAGE
    chunk = min(stride, PAGE)  # a stride divides a page or is whole pages
    per_row = stride // chunk
    raw = torch.from_numpy(buf).view(-1, chunk)
    idx = torch.from_numpy(start // chunk)
    flat = out.view(torch.uint8).view(ids.size, row_bytes)
    if per_row == 1 and chunk == row_bytes:  # unpadded rows of at most a page: one gather straight into out
        torch.index_select(raw, 0, idx, out=flat)
        return out
    rows = raw[idx] if per_row == 1 else raw[(idx[:, None] + torch.arange(per_row)).reshape(-1)]
    flat.copy_(rows.reshape(ids.size, stride)[:, :row_bytes])
    return out
