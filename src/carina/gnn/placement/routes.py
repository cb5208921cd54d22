"""Per-batch transfer routes of a multi-process run, from every rank's row counts.

Each rank knows, for its batch, how many rows it needs from each source (its own
cache, a socket's DRAM, an SSD, a peer's cache). Gathered over all ranks, those
counts are the batch's demand; :func:`plan_batch` schedules it with
:func:`~carina.gnn.placement.schedule.schedule_lp` (the same LP on every rank, so
every rank holds the same plan) and derives, per GPU, the order in which to fetch
its sources: the slowest route first, so the long transfers start early. The LP
is solved in kilobytes (batch demands are tiny in GB and HiGHS tolerances are
absolute); :attr:`BatchRoutes.time_s` is in seconds::

    routes = plan_batch(topo, sources, gpus, counts, row_bytes)   # counts[rank, source]
    routes.order["gpu0"]          # ["ssd1", "gpu1", "dram0"]: fetch in this order
    routes.route_bytes("ssd1", "gpu0")   # bytes the LP delivers on that pair's paths
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from carina.core.errors import ConfigError
from carina.gnn.placement.schedule import Demand, Schedule, schedule_lp
from carina.gnn.placement.topology import Topology

__all__ = ["UNIT_BYTES", "BatchRoutes", "plan_batch"]

#: The LP's unit of data (bytes): kilobytes keep batch-sized demands well above solver tolerances.
UNIT_BYTES = 1e3


@dataclass
class BatchRoutes:
    """The plan of one batch.

    Attributes:
        schedule: The LP plan (flows in :data:`UNIT_BYTES` units).
        bytes: Exact bytes per ``(source, gpu)`` pair (rows x row bytes).
        order: Per GPU, its sources (never itself) in fetch order.
        time_s: Predicted transfer time of the whole batch, all GPUs together.
    """

    schedule: Schedule
    bytes: dict[tuple[str, str], int]
    order: dict[str, list[str]]
    time_s: float

    def route_bytes(self, src: str, gpu: str) -> float:
        """Bytes the LP's paths deliver from ``src`` to ``gpu`` (sum over the pair's paths)."""
        paths = self.schedule.routes().get((src, gpu), [])
        return sum(amount for _, amount in paths) * UNIT_BYTES


def _pair_time(schedule: Schedule, pair: tuple[str, str]) -> float:
    """Time the pair's routes take alone: each path's amount over its narrowest link, the longest path."""
    times = [
        amount / min(schedule.capacity[(a, b)] for a, b in itertools.pairwise(path))
        for path, amount in schedule.routes().get(pair, [])
        if len(path) > 1
    ]
    return max(times, default=0.0)


def plan_batch(
    topo: Topology, sources: list[str], gpus: list[str], counts: np.ndarray, row_bytes: int, *, relay: bool = False
) -> BatchRoutes:
    """Schedule one batch whose ``counts[r, s]`` rows rank ``r`` (GPU ``gpus[r]``) needs from ``sources[s]``.

    ``relay`` lets peer traffic pass through other GPUs (see :func:`schedule_lp`).

    Raises:
        ConfigError: ``counts`` is not ``[len(gpus), len(sources)]`` or names an unknown node.
        CapacityError: A source cannot reach its GPU.
    """
    if counts.shape != (len(gpus), len(sources)):
        raise ConfigError(f"counts must be [{len(gpus)}, {len(sources)}], got {list(counts.shape)}", key="counts")
    exact: dict[tuple[str, str], int] = {}
    demands: list[Demand] = []
    for r, gpu in enumerate(gpus):
        for s, src in enumerate(sources):
            n = int(counts[r, s])
            if n > 0 and src != gpu:
                exact[(src, gpu)] = n * row_bytes
                demands.append(Demand(src, gpu, n * row_bytes / UNIT_BYTES))
    schedule = schedule_lp(topo, demands, relay_gpus=relay)
    order: dict[str, list[str]] = {}
    for gpu in gpus:
        slow = {s: _pair_time(schedule, (s, g)) for s, g in exact if g == gpu}
        order[gpu] = sorted(slow, key=lambda s: (-slow[s], s))
    return BatchRoutes(schedule, exact, order, schedule.time_s * UNIT_BYTES / 1e9)
