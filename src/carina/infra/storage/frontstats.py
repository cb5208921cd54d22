"""Live statistics of several front-end processes: one shared-memory slot each, merged by the parent.

Each front end owns one slot of an anonymous shared mapping (made before the fork) and
republishes its cumulative counters there every :func:`publish_period` seconds: operations
by kind, bytes, errors, connections, its engine's counters and the bucket counts of its
latency histogram (about 4 KiB, copied off the request path; requests only touch the
front end's own :class:`TierStats`). Every ``stats_interval`` the parent reads all slots
and :class:`CombinedStats` turns them into one snapshot with the keys of a single front
end's (:meth:`TierStats.snapshot`): operations, bytes, errors and connections are summed
(so are the rates), the latency histograms are merged bucket by bucket and p50/p99 are
read from the merged histogram (never averaged percentiles), the window's histogram is
the merged total minus the merged total at the previous read, and the compression ratio
is the shared store's (its summed logical over its summed stored bytes).

Reads take no lock (a seqlock): the owner makes the slot's sequence number odd, writes
the slot, and makes it even again; the parent keeps a copy only if the sequence number
was even and the same before and after the copy and the copy's operation count equals
its histogram's total (every finished request is counted in both, so a torn copy shows).
A slot that never reads consistently (its owner died while writing) keeps its last good copy.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from carina.infra.storage.protocol import CMD_NAMES
from carina.infra.storage.stats import LatencyHistogram, TierStats

__all__ = ["OP_NAMES", "CombinedStats", "StatsBoard", "publish_every", "publish_period"]

OP_NAMES = (*CMD_NAMES.values(), "other")  # the names the server counts requests under
_COUNTERS = ("bytes_read", "bytes_written", "errors", "connections", "protocol_errors")
# engine report keys: (name, scale to an integer, how front ends combine)
_ENGINE: tuple[tuple[str, float, str], ...] = (
    ("engine_batches", 1, "sum"), ("engine_jobs", 1, "sum"),
    ("engine_prepare_s", 1e9, "max"), ("engine_prepared_block", 1, "max"),
)  # fmt: skip
_SEQ, _PID, _OPS = 0, 1, 2
_CNT = _OPS + len(OP_NAMES)
_ENG = _CNT + len(_COUNTERS)
_HIST = _ENG + len(_ENGINE)
_WIDTH = _HIST + len(LatencyHistogram().counts)
_TRIES = 1000


def publish_period(stats_interval: float) -> float:
    """How often a front end republishes: a few times per live-stats interval, at most 10 times a second."""
    return max(min(stats_interval / 4, 0.1), 0.005)


class StatsBoard:
    """One slot of cumulative counters per front end, in an anonymous shared mapping inherited by fork."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._mm = mmap.mmap(-1, 8 * _WIDTH * slots)  # MAP_SHARED | MAP_ANONYMOUS, zeroed
        self.table = np.frombuffer(self._mm, dtype=np.int64).reshape(slots, _WIDTH)
        self._good = np.zeros((slots, _WIDTH), dtype=np.int64)  # the reader's last consistent copies
        self._op_index = {name: _OPS + k for k, name in enumerate(OP_NAMES)}

    def publish(self, index: int, stats: TierStats, report: Mapping[str, Any]) -> None:
        """Owner of slot ``index``: replace it with ``stats``' counters and ``report``'s engine counters."""
        values = np.zeros(_WIDTH - 1, dtype=np.int64)  # the slot without its sequence number
        values[_PID - 1] = os.getpid()
        for name, n in stats.ops.items():
            values[self._op_index.get(name, self._op_index["other"]) - 1] += n
        values[_CNT - 1 : _ENG - 1] = [getattr(stats, name) for name in _COUNTERS]
        values[_ENG - 1 : _HIST - 1] = [round(float(report.get(k, 0)) * scale) for k, scale, _ in _ENGINE]
        values[_HIST - 1 :] = stats.latency.counts
        row = self.table[index]
        row[_SEQ] += 1  # odd: being written
        row[1:] = values
        row[_SEQ] += 1  # even: consistent

    def read(self, index: int) -> np.ndarray:
        """A consistent copy of slot ``index`` (the last one seen if the slot stays torn)."""
        row = self.table[index]
        for _ in range(_TRIES):
            seq = int(row[_SEQ])
            if not seq & 1:
                copy = row.copy()
                if int(row[_SEQ]) == seq and int(copy[_SEQ]) == seq and _balanced(copy):
                    self._good[index] = copy
                    break
            time.sleep(0)  # let the owner finish its write
        return self._good[index].copy()


def _balanced(row: np.ndarray) -> bool:
    """Every finished request is in both the operation counts and the histogram."""
    return int(row[_OPS:_CNT].sum()) == int(row[_HIST:].sum())


async def publish_every(
    board: StatsBoard, index: int, stats: TierStats, report: Callable[[], Mapping[str, Any]], period: float
) -> None:
    """A front end's task: republish its slot every ``period`` seconds until cancelled."""
    while True:
        board.publish(index, stats, report())
        await asyncio.sleep(period)


class CombinedStats:
    """The parent's view: every front end's slot merged into one :meth:`TierStats.snapshot`-shaped dict."""

    def __init__(self, board: StatsBoard) -> None:
        self.board = board
        self._stats = TierStats()  # holds the merged counters; its snapshot() makes the rates and percentiles
        self._seen = [0] * len(self._stats.latency.counts)  # merged histogram at the previous snapshot

    def snapshot(self, store: Any = None) -> dict[str, Any]:
        """Combined totals, rates since the previous call, merged p50/p99, the store's ratio, each front end's share.

        Args:
            store: The shared store (its space accounting gives the ratio), or ``None``.
        """
        rows = [self.board.read(i) for i in range(self.board.slots)]
        total = np.sum(rows, axis=0)
        s = self._stats
        s.ops = {name: int(total[_OPS + k]) for k, name in enumerate(OP_NAMES) if total[_OPS + k]}
        for k, name in enumerate(_COUNTERS):
            setattr(s, name, int(total[_CNT + k]))
        s.latency = LatencyHistogram.merged(LatencyHistogram.from_counts(r[_HIST:]) for r in rows)
        now = s.latency.counts
        s.window = LatencyHistogram.from_counts(max(a - b, 0) for a, b in zip(now, self._seen, strict=True))
        self._seen = list(now)
        snap = s.snapshot(store)
        for k, (name, scale, how) in enumerate(_ENGINE):
            column = [int(r[_ENG + k]) for r in rows]
            value = sum(column) if how == "sum" else max(column)
            snap[name] = value / scale if scale != 1 else value
        snap["frontends"] = [_share(r) for r in rows]
        return snap


def _share(row: np.ndarray) -> dict[str, Any]:
    """One front end's part of a combined snapshot."""
    ops = {name: int(row[_OPS + k]) for k, name in enumerate(OP_NAMES) if row[_OPS + k]}
    out: dict[str, Any] = {"pid": int(row[_PID]), "ops": ops}
    out.update((name, int(row[_CNT + k])) for k, name in enumerate(_COUNTERS))
    return out
