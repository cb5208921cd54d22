"""Is a save's time until durable the disk's or the writer's? A same-size disk probe and the writer's timeline.

Issue 7's bound is 1.2 x bytes / measured disk write bandwidth + 0.5 s. A 4 GiB probe measures the disk's
rate over 4 GiB; a checkpoint of 22.6 GB may meet a slower sustained rate. :func:`same_size_probe` writes
as many bytes as the checkpoint, in the checkpoint's folder, the way carina's writers do (carina.io,
O_DIRECT, 64 MiB requests, one fsync at the end) and keeps its own timeline (bytes written against time),
so the rate over the first 4 GiB and over the whole size come from one write. :func:`writer_row` sets a
save's durable time, its writer's timeline (:mod:`carina.ckpt.timeline`) and the probe side by side, and
:func:`attribute` names what held the write phase back, by rules fixed before the run:

- ``disk``: the writer's writes ran at >= 0.9 of the probe's rate over the same bytes;
- else ``copies`` when the feeder waited for lent copies >= 25% of the write phase;
- else ``io_path`` when the feeder was blocked on a full engine queue >= 50% of it (the engine's writes,
  the probe's path, ran slower beside training: CPU, memory or interrupt contention);
- else ``feeder``: it neither waited nor was blocked, yet did not submit fast enough (CPU starvation).

What comes after the write phase (checksums still running, fsync, commit) is in the row as seconds.
:func:`write_passes` is the ckpt benchmarks' fixed-size disk probe (bench_stall.disk_ceiling without fio,
bench_offload.py's 4 GiB passes); both probes write through :func:`write_once`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

REQUEST = 64 << 20


def write_once(eng: Any, target: Path, size: int, buf: Any, every: int = 1 << 30) -> tuple[float, Any]:
    """Write ``size`` bytes to a new file ``target`` through ``eng``, ``buf`` request after request; fsync, close.

    Every disk probe of the ckpt benchmarks writes this way, as carina's writers do (one request in
    flight per ``buf``, the engine's queue full, one fsync at the end).

    Returns:
        The seconds from open to closed, and the write's :class:`carina.ckpt.timeline.Timeline`
        (streams ``submitted`` and ``written``, phase ``fsynced``).
    """
    from carina.ckpt.timeline import Timeline

    tl = Timeline(every)
    h = eng.open(target, "w", size=size)

    def written(fut: Any) -> None:
        if fut.exception() is None:
            tl.add("written", len(buf))

    futs = []
    for off in range(0, size, len(buf)):
        fut = eng.write(h, off, buf)
        fut.add_done_callback(written)
        futs.append(fut)
        tl.mark("submitted", off + len(buf))
    for f in futs:
        f.result()
    tl.mark("written", size)  # a future wakes result() before its callbacks run: count the last ones now
    eng.fsync(h)
    tl.phase("fsynced")
    eng.close_file(h)
    return time.monotonic() - tl.t0, tl


def write_passes(root: Path, size: int, passes: int = 3) -> list[float]:
    """Each timed pass's rate (B/s): ``size`` bytes written with carina.io (O_DIRECT, 64 MiB requests) and fsynced.

    An untimed 64 MiB pass comes first; every pass writes a new file in ``root``, deleted after it. The
    source is a buffer of ones, as in every record so far (:func:`same_size_probe` writes random bytes).
    """
    from carina.io import Direct, IOConfig, IOEngine, aligned_buffer

    target = root / "fio.bin"
    buf = aligned_buffer(REQUEST)
    buf[:] = 1  # touched: no page faults inside the timed writes
    rates = []
    with IOEngine(IOConfig(direct=Direct.ON)) as eng:
        for each in (REQUEST, *[size] * passes):
            took, _ = write_once(eng, target, each, buf)
            target.unlink(missing_ok=True)  # each pass a new file, as each checkpoint is
            rates.append(each / took)
    return rates[1:]


def same_size_probe(root: Path, nbytes: int, every: int = 1 << 30) -> dict[str, Any]:
    """Write ``nbytes`` (rounded up to 64 MiB requests) to a new file in ``root`` like a writer, fsync, delete.

    The source is one 64 MiB buffer of random bytes (no zero or repeated-pattern shortcut a virtual disk
    might take), written by :func:`write_once` through one carina.io engine, O_DIRECT.

    Returns:
        ``bytes``, ``s`` (open to closed, fsynced), ``Bps``, ``unlink_s`` (deleting the file and fsyncing
        the folder, after the timing) and ``timeline`` (streams ``submitted``, ``written``, phase ``fsynced``).
    """
    import numpy as np

    from carina.io import Direct, IOConfig, IOEngine, aligned_buffer

    size = -(-nbytes // REQUEST) * REQUEST
    buf = aligned_buffer(REQUEST)
    buf[:] = np.random.default_rng(0).integers(0, 256, REQUEST, dtype=np.uint8)
    target = root / "same_size_probe.bin"
    with IOEngine(IOConfig(direct=Direct.ON)) as eng:
        took, tl = write_once(eng, target, size, buf, every)
    t0 = time.monotonic()
    target.unlink()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    return {"bytes": size, "s": round(took, 4), "Bps": size / took, "unlink_s": round(time.monotonic() - t0, 4),
            "timeline": tl.to_dict()}  # fmt: skip


def window_rates(points: list[list[float]], window: int) -> list[float]:
    """GB/s over each ``window`` bytes of a ``[[s, bytes], ...]`` stream (from its first point)."""
    rates, (t_prev, b_prev) = [], points[0]
    for t, b in points[1:]:
        if b - b_prev >= window and t > t_prev:
            rates.append(round((b - b_prev) / (t - t_prev) / 1e9, 3))
            t_prev, b_prev = t, b
    return rates


def break_even_Bps(durable_s: float, nbytes: int) -> float | None:
    """The disk rate at or below which ``durable_s`` is within 1.2 x nbytes / rate + 0.5 s (None: never)."""
    return 1.2 * nbytes / (durable_s - 0.5) if durable_s > 0.5 else None


def attribute(
    write_GBps: float | None, probe_GBps: float | None, write_s: float | None, waits: dict[str, float]
) -> str | None:
    """What held the write phase back (the module's rules); None without a probe or a timeline.

    ``waits`` holds ``feed_frontier_s`` and ``feed_queue_s`` (seconds), as :func:`carina.ckpt.timeline.summarize`
    gives them.
    """
    if not write_GBps or not probe_GBps or not write_s:
        return None
    if write_GBps >= 0.9 * probe_GBps:
        return "disk"
    if waits.get("feed_frontier_s", 0.0) >= 0.25 * write_s:
        return "copies"
    if waits.get("feed_queue_s", 0.0) >= 0.5 * write_s:
        return "io_path"
    return "feeder"


#: The fields of :func:`carina.ckpt.timeline.summarize` a row keeps, in its order.
_WRITER_FIELDS = ("first_write_s", "write_s", "write_GBps", "copies_done_s", "feed_frontier_s", "crc_frontier_s",
                  "feed_queue_s", "crc_after_write_s", "fsync_s", "commit_s", "retention_s")  # fmt: skip


def writer_row(durable_s: float | None, bytes_written: int, timeline: dict[str, Any] | None, received_s: float | None,
               probe: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """A summary row's probe and writer fields (seconds from ``save()``; None where a part is missing).

    ``same_size_s``/``same_size_GBps`` (the probe), ``durable_bound_same_s`` = 1.2 x bytes_written /
    probe rate + 0.5 s and ``within_bound_same``; from the writer's timeline: when it took the job
    (``received_s``, from ``save()``), its first write (``first_write_s``) and write phase (``write_s``,
    ``write_GBps``, ``write_over_disk``) from then, the waits,
    the seconds after the last write (``crc_after_write_s``, ``fsync_s``, ``commit_s``), ``retention_s``
    and ``limit`` (:func:`attribute`).
    """
    from carina.ckpt.timeline import summarize

    row: dict[str, Any] = {}
    probe_GBps = None
    if probe:
        probe_GBps = probe["Bps"] / 1e9
        bound = round(1.2 * bytes_written / probe["Bps"] + 0.5, 4)
        row.update({"same_size_s": probe["s"], "same_size_GBps": round(probe_GBps, 4), "durable_bound_same_s": bound,
                    "within_bound_same": None if durable_s is None else durable_s <= bound})  # fmt: skip
    if timeline is None:
        return row
    got = summarize(timeline)
    row["received_s"] = None if received_s is None else round(received_s, 4)
    row.update({k: got[k] for k in _WRITER_FIELDS})
    if probe_GBps and got["write_GBps"]:
        row["write_over_disk"] = round(got["write_GBps"] / probe_GBps, 4)
    row["limit"] = attribute(got["write_GBps"], probe_GBps, got["write_s"], got)
    return row
