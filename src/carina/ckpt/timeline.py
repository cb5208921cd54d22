"""One save's write over time, as its writer saw it: copy frontier, bytes submitted, written, checksummed.

A checkpoint's time until durable does not say whether the disk or the writer set it. The ``thread``,
``process`` and ``sync`` writers keep a :class:`Timeline` per save (the ``fork`` writer does not), and
:meth:`carina.ckpt.Checkpointer.write_timeline` returns it (:meth:`Timeline.to_dict`) for a recent step.
Times are seconds since the writer took the job (``t0``, a ``time.monotonic()`` value, one clock for
every process of the machine); byte counts are offsets into the shard image.

==============  ==========================================================================
stream          bytes ...
==============  ==========================================================================
``frontier``    final in host memory (the lent copies' watermark, as the writer's gate returned it)
``submitted``   handed to the IO engine (its feeder blocks while the engine's queue is full)
``written``     whose writes completed (summed in completion order)
``checksummed`` the checksums have reached (the chunk ending there is being checksummed)
==============  ==========================================================================

Phases: ``copies_done`` (a writer that waits for every lent copy before it starts), ``checksummed``
(every checksum computed), ``fsynced`` (the shard file), ``durable`` (``latest`` names the save),
``done`` (retention of older checkpoints finished). Waits (seconds): ``feed_frontier`` and
``crc_frontier`` (the feeder and the checksums waiting for lent copies), ``feed_queue`` (the feeder
blocked on a full engine queue: the engine, and so the disk, is behind). A stream keeps its first
point, one each time it passes a multiple of ``every`` bytes, and its last: about 23 points for a
22.6 GB save at the default 1 GiB. A stream only rises, and each point is when it first reached its value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from carina.core.errors import ConfigError

__all__ = ["Timeline", "summarize"]


class Timeline:
    """Bytes-over-time of one save's write (thread-safe: the feeder, checksums and completions all mark).

    Args:
        every: Keep a stream's point each time it passes a multiple of this many bytes.

    Raises:
        ConfigError: ``every`` is not positive.
    """

    def __init__(self, every: int = 1 << 30) -> None:
        if every <= 0:
            raise ConfigError(f"Timeline every={every}: must be a positive number of bytes", key="every")
        self.t0 = time.monotonic()
        self.every = every
        self._lock = threading.Lock()
        self._points: dict[str, list[tuple[float, int]]] = {}
        self._next: dict[str, int] = {}
        self._last: dict[str, tuple[float, int]] = {}
        self._sums: dict[str, int] = {}
        self._phases: dict[str, float] = {}
        self._waits: dict[str, float] = {}

    def mark(self, stream: str, value: int, at: float | None = None) -> None:
        """``stream`` reached ``value`` bytes (at ``at``, default now)."""
        now = time.monotonic() if at is None else at
        with self._lock:
            self._mark(stream, value, now)

    def _mark(self, stream: str, value: int, now: float) -> None:
        last = self._last.get(stream)
        if last is not None and value <= last[1]:
            return  # a stream only rises: a repeat, or a lower value another thread marked late, adds nothing
        if last is None or value >= self._next[stream]:
            self._points.setdefault(stream, []).append((now, value))
            self._next[stream] = (value // self.every + 1) * self.every
        self._last[stream] = (now, value)

    def add(self, stream: str, nbytes: int) -> None:
        """``nbytes`` more of ``stream`` are done (completions, which arrive out of order)."""
        now = time.monotonic()
        with self._lock:
            total = self._sums[stream] = self._sums.get(stream, 0) + nbytes
            self._mark(stream, total, now)

    def phase(self, name: str, at: float | None = None) -> None:
        """Phase ``name`` ended now (or at ``at``); the first mark of a phase counts."""
        now = time.monotonic() if at is None else at
        with self._lock:
            self._phases.setdefault(name, now)

    def waited(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to wait ``name``."""
        with self._lock:
            self._waits[name] = self._waits.get(name, 0.0) + seconds

    def gate(self, ready: Callable[[int], int] | None, stream: str | None, wait: str) -> Callable[[int], int]:
        """``ready`` (a copy gate; None: every byte is final) that also marks what it is asked and answers.

        Each call ``gate(n)`` marks ``stream`` at ``n`` (unless None), the frontier ``ready`` returned and
        the time it waited (as wait ``wait``).
        """

        def gated(n: int) -> int:
            start = time.monotonic()
            got = n if ready is None else ready(n)
            now = time.monotonic()
            with self._lock:
                if stream is not None:
                    self._mark(stream, n, now)
                if ready is not None:
                    self._mark("frontier", got, now)
                    self._waits[wait] = self._waits.get(wait, 0.0) + (now - start)
            return got

        return gated

    def to_dict(self) -> dict[str, Any]:
        """The record: ``t0``, ``every``, ``phases`` and ``streams`` ([[s, bytes], ...]) relative to ``t0``."""
        with self._lock:
            streams = {}
            for name, points in self._points.items():
                kept = points if points[-1] == self._last[name] else [*points, self._last[name]]
                streams[name] = [[round(t - self.t0, 6), v] for t, v in kept]
            return {
                "t0": self.t0,
                "every": self.every,
                "phases": {k: round(v - self.t0, 6) for k, v in self._phases.items()},
                "waits_s": {k: round(v, 6) for k, v in self._waits.items()},
                "streams": streams,
            }


def summarize(timeline: dict[str, Any]) -> dict[str, Any]:
    """Where a save's time went, from :meth:`Timeline.to_dict` (seconds since the writer took the job).

    ``first_write_s`` (the first request submitted), ``written_s`` (the last write completed), ``write_s``
    (the span between them, the write phase), ``write_GBps`` (the bytes written over it), ``copies_done_s``
    (the frontier's last rise, or the ``copies_done`` phase), ``checksummed_s``, ``fsynced_s``,
    ``durable_s``, ``done_s``; ``crc_after_write_s`` (checksums still running after the last write),
    ``fsync_s`` (fsync after the later of both), ``commit_s`` (fsynced to durable), ``retention_s``; and
    the waits. None where the timeline lacks the mark.
    """
    phases, streams, waits = timeline["phases"], timeline["streams"], timeline.get("waits_s", {})
    submitted, written, frontier = streams.get("submitted"), streams.get("written"), streams.get("frontier")
    first = submitted[0][0] if submitted else None
    last = written[-1][0] if written else None
    nbytes = written[-1][1] if written else 0
    copies = phases.get("copies_done")
    if copies is None and frontier:
        copies = next(t for t, v in frontier if v == frontier[-1][1])
    crc, fsynced, durable = phases.get("checksummed"), phases.get("fsynced"), phases.get("durable")

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a - b, 6)

    span = diff(last, first)
    return {
        "first_write_s": first,
        "written_s": last,
        "write_s": span,
        "bytes_written": nbytes,
        "write_GBps": round(nbytes / span / 1e9, 4) if span else None,
        "copies_done_s": copies,
        "checksummed_s": crc,
        "fsynced_s": fsynced,
        "durable_s": durable,
        "done_s": phases.get("done"),
        "crc_after_write_s": None if crc is None or last is None else round(max(0.0, crc - last), 6),
        "fsync_s": None if fsynced is None or last is None else round(fsynced - max(last, crc or last), 6),
        "commit_s": diff(durable, fsynced),
        "retention_s": diff(phases.get("done"), durable),
        "feed_frontier_s": waits.get("feed_frontier", 0.0),
        "crc_frontier_s": waits.get("crc_frontier", 0.0),
        "feed_queue_s": waits.get("feed_queue", 0.0),
    }
