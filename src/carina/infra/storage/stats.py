"""Live statistics of the tier: operations, bytes, latency percentiles, compression ratio."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core.errors import ConfigError

__all__ = ["LatencyHistogram", "TierStats"]

_SUB = 16  # buckets per power of two: <= 4.4 % relative error


class LatencyHistogram:
    """Log-bucketed latency histogram (1 us to ~1000 s) with percentile queries."""

    def __init__(self) -> None:
        self.counts = [0] * (30 * _SUB)
        self.total = 0

    def add(self, seconds: float) -> None:
        """Record one latency."""
        self.add_at(self.bucket(seconds))

    @staticmethod
    def bucket(seconds: float) -> int:
        """The bucket a latency falls in."""
        frac, exp = math.frexp(max(seconds * 1e6, 1.0))  # us = frac * 2**exp, frac in [0.5, 1)
        return min((exp - 1) * _SUB + int((frac * 2 - 1) * _SUB), 30 * _SUB - 1)

    def add_at(self, idx: int) -> None:
        """Count one latency in bucket ``idx`` (from :meth:`bucket`)."""
        self.counts[idx] += 1
        self.total += 1

    def percentile(self, q: float) -> float:
        """Latency in seconds below which a fraction ``q`` of samples fall (bucket upper edge)."""
        if not self.total:
            return 0.0
        rank = q * self.total
        seen = 0
        for idx, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                exp, sub = divmod(idx, _SUB)
                return (2.0**exp) * (1 + (sub + 1) / _SUB) / 1e6
        return 0.0

    def reset(self) -> None:
        """Forget every sample."""
        self.counts = [0] * len(self.counts)
        self.total = 0

    @classmethod
    def from_counts(cls, counts: Iterable[int]) -> LatencyHistogram:
        """A histogram holding ``counts`` per bucket (as :attr:`counts` lists them)."""
        hist = cls()
        values = [int(c) for c in counts]
        if len(values) != len(hist.counts):
            raise ConfigError(f"a latency histogram has {len(hist.counts)} buckets, not {len(values)}", key="counts")
        hist.counts, hist.total = values, sum(values)
        return hist

    @classmethod
    def merged(cls, hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
        """One histogram of every sample of ``hists`` (bucket counts summed, so its percentiles are exact merges)."""
        out = cls()
        for h in hists:
            out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
            out.total += h.total
        return out


@dataclass
class TierStats:
    """Counters the front end updates; :meth:`snapshot` turns them into rates."""

    ops: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    connections: int = 0
    protocol_errors: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    window: LatencyHistogram = field(default_factory=LatencyHistogram)
    _last: tuple[float, int, int, int] = field(default_factory=lambda: (time.monotonic(), 0, 0, 0))

    def record(self, op: str, nbytes: int, seconds: float, *, ok: bool = True) -> None:
        """Count one finished request."""
        self.ops[op] = self.ops.get(op, 0) + 1
        if op == "read":
            self.bytes_read += nbytes
        elif op == "write":
            self.bytes_written += nbytes
        if not ok:
            self.errors += 1
        idx = LatencyHistogram.bucket(seconds)  # one bucket computation for both histograms
        self.latency.add_at(idx)
        self.window.add_at(idx)

    def snapshot(self, store: Any = None) -> dict[str, Any]:
        """Totals plus rates since the previous snapshot (IOPS, MB/s, p50/p99 of the window)."""
        now = time.monotonic()
        total_ops = sum(self.ops.values())
        t0, ops0, r0, w0 = self._last
        dt = max(now - t0, 1e-9)
        out: dict[str, Any] = {
            "ops": dict(self.ops),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "errors": self.errors,
            "protocol_errors": self.protocol_errors,
            "connections": self.connections,
            "iops": (total_ops - ops0) / dt,
            "read_mb_s": (self.bytes_read - r0) / dt / 1e6,
            "write_mb_s": (self.bytes_written - w0) / dt / 1e6,
            "p50_ms": self.window.percentile(0.5) * 1e3,
            "p99_ms": self.window.percentile(0.99) * 1e3,
            "p50_ms_total": self.latency.percentile(0.5) * 1e3,
            "p99_ms_total": self.latency.percentile(0.99) * 1e3,
        }
        if store is not None:
            st = store.stats()
            out.update(
                stored_bytes=st.stored_bytes, logical_bytes=st.logical_bytes, ratio=st.ratio, log_bytes=st.log_bytes
            )
        self._last = (now, total_ops, self.bytes_read, self.bytes_written)
        self.window.reset()
        return out


def write_stats_file(path: Path, snapshot: dict[str, Any]) -> None:
    """Atomically replace ``path`` with ``snapshot`` as JSON (read by ``carina storage stats``)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot, indent=2) + "\n")
    os.replace(tmp, path)
