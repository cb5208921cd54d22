"""A static feature cache across GPU and host memory, filled by hotness.

Nodes are ranked once, by in-graph popularity (how often a node is a neighbour:
its out-degree) or by counting appearances in pre-sampled batches. The hottest
``gpu_rows`` live in a device tensor, the next ``host_rows`` in host memory
(pinned when CUDA is present); everything else comes from disk. One ``int32``
slot map on the sampling device answers "where is node v" for a whole batch in
one gather: ``>= 0`` a GPU slot, ``<= -2`` host slot ``-(s + 2)``, ``-1`` a miss.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from carina.core.config import Config, require
from carina.core.errors import CapacityError
from carina.gnn import hostread
from carina.gnn.graph import CSCGraph

__all__ = [
    "CacheConfig",
    "CacheLookup",
    "HotnessSource",
    "StaticCache",
    "degree_hotness",
    "presample_hotness",
]

MISS = -1
_TIER_SHIFT = 40  # lookup keys: the tier above 40 bits of node id or batch position


class HotnessSource(enum.Enum):
    """How nodes are ranked for the cache."""

    DEGREE = "degree"
    PRESAMPLE = "presample"


@dataclass(kw_only=True)
class CacheConfig(Config):
    """Cache sizes in rows and how hotness is measured.

    Attributes:
        gpu_rows: Rows kept on the compute device.
        host_rows: Rows kept in host memory.
        hotness: ``degree`` or ``presample``.
        presample_batches: Batches sampled to measure hotness (``presample``).
    """

    gpu_rows: int = 0
    host_rows: int = 0
    hotness: HotnessSource = HotnessSource.PRESAMPLE
    presample_batches: int = 8

    def validate(self) -> None:
        """Sizes are non-negative."""
        require(self.gpu_rows >= 0, "gpu_rows must be >= 0", key="gpu_rows")
        require(self.host_rows >= 0, "host_rows must be >= 0", key="host_rows")
        require(self.presample_batches > 0, "presample_batches must be positive", key="presample_batches")


def degree_hotness(graph: CSCGraph) -> torch.Tensor:
    """How often each node is somebody's in-neighbour (its out-degree), as float."""
    return torch.bincount(graph.indices.to(torch.int64), minlength=graph.num_nodes).to(torch.float32)


def presample_hotness(batches: list[torch.Tensor], num_nodes: int) -> torch.Tensor:
    """Appearances of each node in the ``n_id`` of pre-sampled batches."""
    counts = torch.zeros(num_nodes, dtype=torch.float32)
    for n_id in batches:
        counts += torch.bincount(n_id.cpu(), minlength=num_nodes).to(torch.float32)
    return counts


@dataclass
class CacheLookup:
    """Where each row of a batch lives.

    Attributes:
        gpu_pos / gpu_slot: Batch positions served by the GPU slice, and their slots.
        host_pos / host_slot: Same for the host slice (on the CPU, or on the cache device when
            the device gathers them).
        miss_pos: Batch positions to read from disk.
        miss_ids: Their node ids, on the CPU, sorted ascending (``miss_pos`` follows).
    """

    gpu_pos: torch.Tensor
    gpu_slot: torch.Tensor
    host_pos: torch.Tensor
    host_slot: torch.Tensor
    miss_pos: torch.Tensor
    miss_ids: torch.Tensor


class StaticCache:
    """GPU slice + host slice of the hottest rows.

    Args:
        hotness: One score per node; higher is cached first (ties by node id).
        config: Sizes.
        dim: Feature width.
        dtype: Feature dtype.
        device: Where the GPU slice and the slot map live.
        fetch: Reads rows by node id (CPU int64) into a tensor on the CPU or the cache's
            device (a device tensor goes to each slice by one DMA, no pageable copy); used to fill.
        host_budget_bytes: Refuse (before allocating) a host slice above this.
    """

    def __init__(
        self,
        *,
        hotness: torch.Tensor,
        config: CacheConfig,
        dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
        fetch: Callable[[torch.Tensor], torch.Tensor],
        host_budget_bytes: int | None = None,
    ) -> None:
        n = hotness.numel()
        if n >= 1 << _TIER_SHIFT:
            raise CapacityError(f"a cache of {n} nodes: lookup keys hold node ids below 2**{_TIER_SHIFT}", nodes=n)
        self.device = torch.device(device)
        self.config = config
        gpu_rows = min(config.gpu_rows, n)
        host_rows = min(config.host_rows, n - gpu_rows)
        row_bytes = dim * dtype.itemsize
        if host_budget_bytes is not None and host_rows * row_bytes > host_budget_bytes:
            raise CapacityError(
                f"host cache of {host_rows} rows needs {host_rows * row_bytes} bytes",
                budget=host_budget_bytes,
            )
        # stable sort on the cache device (the same order as on the CPU; seconds faster at 2^26 nodes on a GPU)
        order = torch.sort(hotness.to(self.device), descending=True, stable=True).indices.cpu()
        gpu_ids = order[:gpu_rows].sort().values
        host_ids = order[gpu_rows : gpu_rows + host_rows].sort().values
        self.slot = torch.full((n,), MISS, dtype=torch.int32)
        self.slot[gpu_ids] = torch.arange(gpu_rows, dtype=torch.int32)
        self.slot[host_ids] = -2 - torch.arange(host_rows, dtype=torch.int32)
        self.slot = self.slot.to(self.device)
        # the device slice is allocated on the device: no host copy of it first (11 GB at 2^26 x 512 B / 3)
        self.gpu = _filled(gpu_ids, dim, dtype, fetch, device=self.device)
        # filled in place in pinned memory: no pageable copy of the slice first (half the peak, one copy less)
        self.host = _filled(host_ids, dim, dtype, fetch, pin=torch.cuda.is_available() and host_rows > 0)
        self.gpu_rows, self.host_rows = gpu_rows, host_rows

    @property
    def nbytes(self) -> dict[str, int]:
        """Bytes held per tier."""
        return {
            "gpu": self.gpu.numel() * self.gpu.element_size(),
            "host": self.host.numel() * self.host.element_size(),
        }

    def lookup(self, n_id: torch.Tensor, *, host_on_device: bool = False) -> CacheLookup:
        """Split a batch's node ids (unique; on the cache device or the CPU) by tier.

        Positions come on the cache device whatever device the ids are on: ids on the CPU (a
        user's, or ``read_rows``') are copied there once, the copy the slot map's gather needs
        anyway (session 12 on the H200: CPU ids indexed with device positions raised).
        The host tier's positions and slots come to the CPU (where the IO thread gathers the
        rows), or stay on the cache device with ``host_on_device`` (the device gathers them:
        :class:`carina.gnn.hostpath.HostGather`).

        One gather of the slot map and one sort make the split: each id's key is its tier above
        its batch position (GPU and host hits) or its node id (misses), so the sorted keys hold
        the GPU hits, the host hits and the misses in turn, hits in batch order and misses by id
        (what the page planner wants). Two host reads (:mod:`carina.gnn.hostread`) whatever the
        batch: the tiers' sizes, then one copy of what the CPU needs (the misses' ids, and on the
        cpu path the host hits' positions and slots). Before session 13 the split took three
        ``nonzero`` (one host read each), the misses' ids, a sort on the CPU and its order copied
        back from pageable memory, and on the cpu path two more copies: five or seven waits.
        """
        n_id = n_id.to(self.device)
        s = self.slot.index_select(0, n_id)
        host = s <= -2
        miss = s == MISS
        tier = host.to(torch.int64) + 2 * miss.to(torch.int64)  # 0 GPU, 1 host, 2 miss
        pos = torch.arange(n_id.numel(), device=self.device)
        key = torch.bitwise_left_shift(tier, _TIER_SHIFT) + torch.where(miss, n_id.to(torch.int64), pos)
        key, order = torch.sort(key, stable=True)
        g, h = hostread.host_ints(torch.stack([(s >= 0).sum(), host.sum()]))
        gpu_pos, host_pos, miss_pos = order[:g], order[g : g + h], order[g + h :]
        host_slot = (-2 - s[host_pos]).to(torch.int64)
        miss_ids = key[g + h :] - (2 << _TIER_SHIFT)
        if host_on_device:
            miss_ids = hostread.to_host(miss_ids)
        else:  # one copy for the three: the IO thread gathers the host hits
            on_host = hostread.to_host(torch.cat([host_pos, host_slot, miss_ids]))
            host_pos, host_slot, miss_ids = on_host[:h], on_host[h : 2 * h], on_host[2 * h :]
        return CacheLookup(
            gpu_pos=gpu_pos,
            gpu_slot=s[gpu_pos].to(torch.int64),
            host_pos=host_pos,
            host_slot=host_slot,
            miss_pos=miss_pos,
            miss_ids=miss_ids,
        )


def _filled(
    ids: torch.Tensor,
    dim: int,
    dtype: torch.dtype,
    fetch: Callable[[torch.Tensor], torch.Tensor],
    *,
    pin: bool = False,
    device: torch.device | None = None,
) -> torch.Tensor:
    out = torch.empty(ids.numel(), dim, dtype=dtype, pin_memory=pin, device=device)
    step = 1 << 16
    for lo in range(0, ids.numel(), step):
        out[lo : lo + step].copy_(fetch(ids[lo : lo + step]))
    return out
