"""Throughput-per-cost model: predict each stage's time and pick SSDs and cache sizes.

Per batch, with ``U`` unique input nodes of which a fraction ``h_g`` hit the GPU
cache and ``h_c`` the host cache (read off the measured hotness curve at the
cache sizes), the stages are::

    sample         = measured sampling time per batch (GPU or CPU sampler)
    lookup         = t_lookup + U t_id + U h_c t_host (cpu path only)  (the cache lookup, sampler thread)
    compute        = measured forward + backward + step per batch
    disk           = carina.gnn.diskcost.disk_seconds(IOs, pages)   (the missed rows' reads, k SSDs)
    host gather on the CPU (host_gather "cpu"):
      gather       = U h_c row / B_gather                              (the IO thread, into staging)
      transfer     = U (1 - h_g) row / B_pcie                          (staged rows to the device)
    host gather on the device (host_gather "device"):
      device_gather = U h_c (row / B_uva + t_row)                      (the device reads the slice in place)
      transfer     = U (1 - h_g - h_c) row / B_pcie                    (the missed rows only)

The sampler thread samples a batch and then looks it up in the cache (the slot map's gather and
sort, and the host reads of the tiers' sizes and of what the CPU needs: on the ``cpu`` path also
the host hits' positions and slots, ``t_host`` a row); an in-memory run has no lookup
(:func:`predict_in_memory`). The lookup's rates come from ``carina gnn calibrate`` (session 13 on);
a calibration made before has none, and the lookup is then priced at 0 (``lookup_priced``).

The pipeline runs lanes side by side: the IO thread (disk reads, then the CPU
gather of host hits: lane ``disk``) and the device. When the sampler runs on the
training device (``WorkloadProfile.sample_lane == "shared"``, what
:mod:`carina.gnn.runner` does) its kernels queue on the same stream as the copies,
the device gather and the step, so the device lane is
``sample + lookup + transfer + device_gather + compute`` (lane ``compute``) and
``T_batch = max(disk + gather, device lane)``; a sampler with a device of its
own (``"own"``) is a third lane, ``sample + lookup``. Without overlap the batch is the sum of the
stages. Throughput per dollar divides seeds/s by the machine's price
(base + GPU + k SSDs).

Why ``shared``: on the H200 (session 8, ``gnn_outofcore_papers_25x10_h200``) the
profiled sampler took 7.6 ms per [25,10] @ 8000 batch alone and the step 5.8 ms,
and the pipelined in-memory run took 13.5 ms per batch, their sum, not their
max (the model then predicted 1.77x that run's throughput).
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field

from carina.core.config import Config, require
from carina.core.errors import CapacityError, ConfigError
from carina.gnn.diskcost import DISK_COSTS, best_gap_pages, disk_requests, disk_seconds
from carina.gnn.hostpath import HostGather

__all__ = [
    "SAMPLE_LANES",
    "MachineSpec",
    "Overlap",
    "Prediction",
    "WorkloadProfile",
    "best_gap_pages",
    "disk_seconds",
    "hit_rate",
    "lookup_seconds",
    "predict",
    "predict_in_memory",
    "recommend",
]

SAMPLE_LANES = ("shared", "own")
_LOOKUP_KEYS = ("lookup_batch_us", "lookup_id_ns", "lookup_host_id_ns")


class Overlap(enum.Enum):
    """Whether stages run concurrently (pipelined) or one after another."""

    PIPELINED = "pipelined"
    SERIAL = "serial"


@dataclass(kw_only=True)
class MachineSpec(Config):
    """A machine as the model sees it (measured by ``calibrate`` or described).

    Attributes:
        name: Label.
        ssd_count: SSDs striped for features.
        ssd_read_gbps: Large-read bandwidth of one SSD (GB/s).
        ssd_iops: 4 KiB random-read IOPS of one SSD at depth.
        pcie_gbps: Host -> device bandwidth (GB/s); on a CPU-only machine the memcpy rate.
        host_gather_gbps: Rate of gathering scattered rows in host memory (GB/s).
        gpu_mem_gb / host_mem_gb: Memory available for caches (GB).
        base_price_usd / gpu_price_usd / ssd_price_usd: Prices for TPC.
        bus_limit_gbps: Aggregate SSD bandwidth the host can take (PCIe lanes).
        disk_cost: How a read's cost combines its count and its bytes (:mod:`carina.gnn.diskcost`):
            ``"additive"`` (a fixed cost per request plus its pages at the bandwidth) or
            ``"overlapped"`` (the larger of the request count at the IOPS and the bytes at the
            bandwidth: an optimistic bound).
        uva_gbps / uva_row_ns: The device's gather of rows from host memory read in place (on
            CUDA: pinned memory mapped into the GPU), ``rows (row / B + t_row)``; 0: not
            measured (the ``device`` host path cannot be priced).
        disk_probe_pages / disk_probe_us: The calibration's probe of the disk form: random
            reads of that many pages each, microseconds per read at depth (0: not probed).
        lookup_batch_us / lookup_id_ns / lookup_host_id_ns: The cache lookup on the sampler thread,
            ``t_lookup + U t_id + U h_c t_host``: microseconds a batch, nanoseconds per id of the
            batch, and nanoseconds per host hit whose position and slot come to the CPU (the ``cpu``
            host path only). All 0: not calibrated (calibrations before session 13); the lookup is
            then priced at 0.
    """

    name: str = "machine"
    ssd_count: int = 1
    ssd_read_gbps: float = 3.0
    ssd_iops: float = 700_000.0
    pcie_gbps: float = 25.0
    host_gather_gbps: float = 10.0
    gpu_mem_gb: float = 40.0
    host_mem_gb: float = 256.0
    base_price_usd: float = 14_098.0
    gpu_price_usd: float = 14_177.0
    ssd_price_usd: float = 308.0
    bus_limit_gbps: float = 25.0
    disk_cost: str = "additive"
    uva_gbps: float = 0.0
    uva_row_ns: float = 0.0
    disk_probe_pages: int = 0
    disk_probe_us: float = 0.0
    lookup_batch_us: float = 0.0
    lookup_id_ns: float = 0.0
    lookup_host_id_ns: float = 0.0

    def validate(self) -> None:
        """All rates positive (the device gather's: or 0, not measured); a known disk cost model."""
        require(self.disk_cost in DISK_COSTS, f"disk_cost must be one of {DISK_COSTS}", key="disk_cost")
        for key in ("ssd_read_gbps", "ssd_iops", "pcie_gbps", "host_gather_gbps", "bus_limit_gbps"):
            require(getattr(self, key) > 0, f"{key} must be positive", key=key)
        for key in ("uva_gbps", "uva_row_ns", "disk_probe_pages", "disk_probe_us", *_LOOKUP_KEYS):
            require(getattr(self, key) >= 0, f"{key} must be >= 0", key=key)
        require(self.ssd_count >= 0, "ssd_count must be >= 0", key="ssd_count")

    @property
    def device_gather_priced(self) -> bool:
        """Whether the ``device`` host path has a measured rate."""
        return self.uva_gbps > 0

    @property
    def lookup_priced(self) -> bool:
        """Whether the cache lookup has measured rates (a calibration from session 13 on)."""
        return any(getattr(self, k) > 0 for k in _LOOKUP_KEYS)

    @property
    def price_usd(self) -> float:
        """Price of the machine with its SSDs."""
        return self.base_price_usd + self.gpu_price_usd + self.ssd_count * self.ssd_price_usd


@dataclass(kw_only=True)
class WorkloadProfile(Config):
    """A training workload measured on its graph.

    Attributes:
        num_nodes: Nodes in the graph.
        row_bytes / row_stride: Feature row size and its on-disk stride.
        batch_size: Seeds per batch.
        batches_per_epoch: Batches in an epoch.
        unique_per_batch: Mean unique input nodes per batch.
        sample_s / compute_s: Measured seconds per batch.
        hotness_curve: Cumulative share of row accesses served by the hottest
            ``i / (len - 1)`` fraction of nodes (starts at 0.0, ends at 1.0).
        sample_lane: ``"shared"``: the sampler runs on the training device, in one
            lane with the copies and the step (their times add); ``"own"``: it has a
            device (or cores) of its own and overlaps them.
    """

    num_nodes: int
    row_bytes: int
    row_stride: int
    batch_size: int
    batches_per_epoch: int
    unique_per_batch: float
    sample_s: float
    compute_s: float
    hotness_curve: list[float] = field(default_factory=lambda: [0.0, 1.0])
    sample_lane: str = "shared"

    def validate(self) -> None:
        """Sizes positive; the curve rises from 0 to 1; a known sample lane."""
        require(self.sample_lane in SAMPLE_LANES, f"sample_lane must be one of {SAMPLE_LANES}", key="sample_lane")
        require(self.num_nodes > 0 and self.row_bytes > 0, "empty workload", key="num_nodes")
        curve = self.hotness_curve
        require(len(curve) >= 2 and curve[0] == 0.0, "hotness_curve starts at 0", key="hotness_curve")
        require(abs(curve[-1] - 1.0) < 1e-6, "hotness_curve ends at 1", key="hotness_curve")
        require(all(b >= a for a, b in itertools.pairwise(curve)), "curve must rise", key="hotness_curve")

    @property
    def feature_bytes(self) -> int:
        """All rows."""
        return self.num_nodes * self.row_bytes


def hit_rate(curve: list[float], fraction: float) -> float:
    """Share of accesses served by the hottest ``fraction`` of nodes (linear interpolation)."""
    fraction = min(max(fraction, 0.0), 1.0)
    pos = fraction * (len(curve) - 1)
    i = min(int(pos), len(curve) - 2)
    return curve[i] + (curve[i + 1] - curve[i]) * (pos - i)


@dataclass
class Prediction:
    """Predicted per-batch stage times (s), lane times, the bottleneck, epoch time and TPC."""

    stages: dict[str, float]
    batch_s: float
    bottleneck: str
    epoch_s: float
    seeds_per_s: float
    tpc: float
    gpu_hit: float
    host_hit: float
    disk_pages: float
    disk_ios: float
    config: dict[str, float] = field(default_factory=dict)
    host_gather: str = "cpu"
    lanes: dict[str, float] = field(default_factory=dict)  # disk (the IO thread), compute (the device), [sample]


def predict(
    machine: MachineSpec,
    work: WorkloadProfile,
    *,
    gpu_cache_rows: int,
    host_cache_rows: int,
    overlap: Overlap = Overlap.PIPELINED,
    gap_pages: int = 0,
    host_gather: HostGather = HostGather.CPU,
    lookup: bool = True,
) -> Prediction:
    """Predict one configuration (cache sizes in rows, read-gap policy, host path) on ``machine``.

    ``host_gather``: ``cpu`` or ``device`` (module docstring); ``auto`` is ``device`` where the
    machine has a device-gather rate (``uva_gbps``). A calibration on the CPU sets that rate too (the
    host gather's), where the store's ``auto`` takes ``cpu``: to price a run, pass the store's
    resolved :attr:`~carina.gnn.store.OutOfCoreFeatures.host_path`. ``lookup=False``: no cache
    lookup on the sampler thread (the in-memory baseline: :func:`predict_in_memory`).

    Raises:
        CapacityError: Rows miss the caches and the machine has no SSD.
        ConfigError: ``device`` asked of a machine without a device-gather rate.
    """
    n = work.num_nodes
    gpu_rows = min(gpu_cache_rows, n)
    host_rows = min(host_cache_rows, n - gpu_rows)
    h_g = hit_rate(work.hotness_curve, gpu_rows / n)
    h_c = hit_rate(work.hotness_curve, (gpu_rows + host_rows) / n) - h_g
    u = work.unique_per_batch
    misses = u * (1.0 - h_g - h_c)
    pages, ios = disk_requests(misses, num_nodes=n, row_stride=work.row_stride, gap_pages=gap_pages)
    k = machine.ssd_count
    if k == 0 and misses > 1e-9:
        raise CapacityError("no SSD but rows miss the caches", misses_per_batch=misses)
    disk = disk_seconds(machine, ios, pages) if k and misses > 0 else 0.0
    path = _host_path(machine, host_gather)
    stages = {"sample": work.sample_s, "lookup": lookup_seconds(machine, work, h_c, path) if lookup else 0.0}
    stages |= {"disk": disk} | _host_stages(machine, work, h_g, h_c, path)
    stages["compute"] = work.compute_s
    lanes = _lanes(stages, work.sample_lane)
    if overlap is Overlap.PIPELINED:
        bottleneck = max(lanes, key=lambda s: lanes[s])
        batch = lanes[bottleneck]
    else:
        bottleneck = max(stages, key=lambda s: stages[s])
        batch = sum(stages.values())
    seeds_per_s = work.batch_size / batch if batch > 0 else math.inf
    return Prediction(
        stages=stages,
        batch_s=batch,
        bottleneck=bottleneck,
        epoch_s=batch * work.batches_per_epoch,
        seeds_per_s=seeds_per_s,
        tpc=seeds_per_s / machine.price_usd,
        gpu_hit=h_g,
        host_hit=h_c,
        disk_pages=pages,
        disk_ios=ios,
        config={"gpu_cache_rows": gpu_rows, "host_cache_rows": host_rows, "ssd_count": k, "gap_pages": gap_pages},
        host_gather=path.value,
        lanes=lanes,
    )


def predict_in_memory(machine: MachineSpec, work: WorkloadProfile) -> Prediction:
    """The in-memory baseline: every row on the device, no disk, no host path, no cache lookup."""
    return predict(machine, work, gpu_cache_rows=work.num_nodes, host_cache_rows=0, lookup=False)


def lookup_seconds(machine: MachineSpec, work: WorkloadProfile, h_c: float, path: HostGather) -> float:
    """The cache lookup of one batch on the sampler thread (0 where the machine has no lookup rates)."""
    u = work.unique_per_batch
    host = u * h_c * machine.lookup_host_id_ns * 1e-9 if path is HostGather.CPU else 0.0
    return machine.lookup_batch_us * 1e-6 + u * machine.lookup_id_ns * 1e-9 + host


def _host_path(machine: MachineSpec, mode: HostGather) -> HostGather:
    if mode is HostGather.AUTO:
        return HostGather.DEVICE if machine.device_gather_priced else HostGather.CPU
    if mode is HostGather.DEVICE and not machine.device_gather_priced:
        raise ConfigError(
            "the device host path needs a measured uva_gbps (carina gnn calibrate on CUDA)", key="uva_gbps"
        )
    return mode


def _host_stages(
    machine: MachineSpec, work: WorkloadProfile, h_g: float, h_c: float, path: HostGather
) -> dict[str, float]:
    """The host path's stages: ``gather``, ``transfer`` and ``device_gather``, seconds per batch.

    ``gather``: the CPU on the IO thread; ``transfer``: copies to the device; ``device_gather``: the
    device reading the host hits in place, at ``uva_gbps`` plus ``uva_row_ns`` a row.
    """
    u, row = work.unique_per_batch, work.row_bytes
    on_device = path is HostGather.DEVICE
    per_row = row / (machine.uva_gbps * 1e9) + machine.uva_row_ns * 1e-9 if on_device else 0.0
    return {
        "gather": 0.0 if on_device else u * h_c * row / (machine.host_gather_gbps * 1e9),
        "transfer": u * (1 - h_g - (h_c if on_device else 0.0)) * row / (machine.pcie_gbps * 1e9),
        "device_gather": u * h_c * per_row,
    }


def _lanes(stages: dict[str, float], sample_lane: str) -> dict[str, float]:
    """Seconds per batch of each pipeline lane: the IO thread, the device, and a sampler of its own.

    The sampler thread's work is the sample and the cache lookup.
    """
    device = stages["transfer"] + stages.get("device_gather", 0.0) + stages["compute"]
    lanes = {"disk": stages["disk"] + stages["gather"], "compute": device}
    sampler = stages["sample"] + stages.get("lookup", 0.0)
    if sample_lane == "shared":
        lanes["compute"] += sampler
    else:
        lanes["sample"] = sampler
    return lanes


def recommend(
    machine: MachineSpec,
    work: WorkloadProfile,
    *,
    budget_usd: float | None = None,
    max_ssds: int = 16,
    gpu_reserve_gb: float = 8.0,
    host_reserve_gb: float = 16.0,
) -> tuple[Prediction, list[Prediction]]:
    """Best throughput-per-dollar configuration within ``budget_usd``.

    Caches are as large as the memory left after the reserves (more cache never
    hurts in this model) and reads merge holes up to :func:`best_gap_pages`; the
    search is over the SSD count and, where the machine has a device-gather rate, the host
    path (``cpu`` or ``device``, the faster per SSD count). Returns the best prediction and
    the candidate kept for each SSD count.

    Raises:
        CapacityError: No SSD count fits the budget.
    """
    gpu_rows = int(max(0.0, machine.gpu_mem_gb - gpu_reserve_gb) * 1e9 // work.row_bytes)
    host_rows = int(max(0.0, machine.host_mem_gb - host_reserve_gb) * 1e9 // work.row_bytes)
    gpu_rows = min(gpu_rows, work.num_nodes)
    host_rows = min(host_rows, work.num_nodes - gpu_rows)
    fits_in_memory = gpu_rows + host_rows >= work.num_nodes
    paths = [HostGather.CPU, HostGather.DEVICE] if machine.device_gather_priced and host_rows else [HostGather.CPU]
    candidates: list[Prediction] = []
    for k in range(0 if fits_in_memory else 1, max_ssds + 1):
        m = MachineSpec.from_dict({**machine.to_dict(), "ssd_count": k})
        if budget_usd is not None and m.price_usd > budget_usd:
            continue
        gap = best_gap_pages(m)
        per_path = [
            predict(m, work, gpu_cache_rows=gpu_rows, host_cache_rows=host_rows, gap_pages=gap, host_gather=h)
            for h in paths
        ]
        candidates.append(min(per_path, key=lambda p: p.batch_s))
    if not candidates:
        raise CapacityError("no SSD count fits the budget", budget_usd=budget_usd)
    return max(candidates, key=lambda p: p.tpc), candidates
