"""What a batch's missed rows cost the disk: pages and IOs for a read policy, and their time.

Pages touched by ``m`` missed rows spread over a file of ``P`` pages (rows smaller than a
page share pages): ``P (1 - exp(-m r / P))``; IOs are the touched pages whose predecessor was
not read, and a read policy that reads through holes of up to ``g`` pages merges runs
(:func:`disk_requests`). Their time (:func:`disk_seconds`) takes one of two forms,
``MachineSpec.disk_cost``:

* ``additive``: each request costs a fixed ``c`` plus its pages at the bandwidth,
  ``IOs c + pages 4 KiB / B``, where ``c = 1 / IOPS - 4 KiB / B``: the IOPS are measured with
  4 KiB reads, so ``1 / IOPS`` already holds one page's transfer. (Until session 10 the form
  charged ``IOs / IOPS + pages 4 KiB / B``, which counts that page twice; on the H200 in
  lane_h200_s9 its disk times came out 1.04-1.66x the read stages measured, against 0.86-1.38x
  for this one: see ``gnn_goals_h200_s9``.)
* ``overlapped``: ``max(IOs / IOPS, pages 4 KiB / B)``, as if the drive hid per-request cost
  behind transfers (an optimistic bound).

Both forms give one page's read ``1 / IOPS`` and a long sequential read ``bytes / B``: they
agree at the two rates the calibration measures and differ in between, most at reads of
``g = B / (IOPS 4 KiB)`` pages (additive over overlapped ``2 - 1 / g``).
"""

from __future__ import annotations

import math
from typing import Protocol


class DiskSpec(Protocol):
    """The disk fields of :class:`carina.gnn.costmodel.MachineSpec` this module prices with."""

    ssd_count: int
    ssd_iops: float
    ssd_read_gbps: float
    bus_limit_gbps: float
    disk_cost: str


__all__ = ["DISK_COSTS", "PAGE", "best_gap_pages", "disk_requests", "disk_seconds", "form_seconds"]

PAGE = 4096
DISK_COSTS = ("additive", "overlapped")


def disk_seconds(machine: DiskSpec, ios: float, pages: float) -> float:
    """Time for ``ios`` requests reading ``pages`` 4 KiB pages in all, striped over the SSDs.

    ``machine.disk_cost`` picks the form (module docstring): :func:`form_seconds` at ``k`` SSDs'
    IOPS and bandwidth, the transfer capped at ``B_bus``.
    """
    k = machine.ssd_count
    if k == 0 or pages <= 0:
        return 0.0
    return form_seconds(
        machine.disk_cost,
        ios,
        pages,
        iops=k * machine.ssd_iops,
        ssd_bps=k * machine.ssd_read_gbps * 1e9,
        bus_bps=machine.bus_limit_gbps * 1e9,
    )


def form_seconds(
    form: str, ios: float, pages: float, *, iops: float, ssd_bps: float, bus_bps: float = math.inf
) -> float:
    """Seconds for ``ios`` requests reading ``pages`` pages in all, in disk cost ``form``.

    Args:
        form: ``"additive"`` or ``"overlapped"`` (module docstring).
        ios: Requests.
        pages: 4 KiB pages the requests read, in all.
        iops: The disks' 4 KiB reads per second (all of them together).
        ssd_bps: The disks' bytes per second (all of them together).
        bus_bps: Bytes per second the host takes from them (caps the transfer, not a request's own cost).
    """
    transfer = pages * PAGE / min(ssd_bps, bus_bps)
    if form == "additive":
        return ios * max(0.0, 1.0 / iops - PAGE / ssd_bps) + transfer
    return max(ios / iops, transfer)


def disk_requests(misses: float, *, num_nodes: int, row_stride: int, gap_pages: int = 0) -> tuple[float, float]:
    """Expected ``(pages read, IOs)`` for ``misses`` rows scattered over the file.

    Touched pages have density ``rho`` over the file. A run continues across a hole of
    ``j <= gap_pages`` unneeded pages (read and discarded) and breaks at a longer one, so IOs
    are ``touched (1 - rho)^(gap+1)`` and each touched page drags in
    ``sum_{j<=gap} j rho (1 - rho)^j`` hole pages on average.
    """
    if misses <= 0:
        return 0.0, 0.0
    file_pages = max(1.0, num_nodes * row_stride / PAGE)
    # several rows share a page (stride < page): pages dedup; else each row is whole pages of its own
    shared = row_stride < PAGE
    touched = file_pages * (1.0 - math.exp(-misses / file_pages)) if shared else misses * row_stride / PAGE
    rho = min(1.0, touched / file_pages)
    ios = touched * (1.0 - rho) ** (gap_pages + 1)
    holes = sum(j * rho * (1.0 - rho) ** j for j in range(1, gap_pages + 1))
    return touched * (1.0 + holes), ios


def best_gap_pages(machine: DiskSpec, *, limit: int = 255) -> int:
    """Largest hole worth reading through: an IO of ``g + 1`` pages costs no more than two IOs.

    Reading through a hole of ``g`` pages costs ``g`` pages of transfer and saves one request.
    Additive: it saves ``c = 1 / IOPS - 4 KiB / B``, so it pays while ``g 4 KiB / B <= c``;
    overlapped: an IOPS-bound read of up to ``B / IOPS`` bytes costs what a one-page read
    does, so ``g + 1`` pages pay. Both give ``g <= B / (IOPS 4 KiB) - 1``.
    """
    pages = machine.ssd_read_gbps * 1e9 / (machine.ssd_iops * PAGE)
    return int(max(0, min(limit, math.floor(pages) - 1)))
