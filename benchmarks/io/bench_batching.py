"""Why a fixed queue depth gives fewer IOPS when requests are submitted and reaped in batches.

Two measurements on one file (``O_DIRECT``, 4 KiB random reads), made to
explain the gap between carina and fio at queue depth 32:

* ``batch_latency``: one ``io_uring_enter`` submits ``n`` reads at once
  (carina's ring, ``n`` = 8, 32, 128) and the reads' completions are polled;
  the record keeps when the first and the last of them arrived and in how many
  groups. A device that serves a submitted batch as one unit returns it all
  at once.
* ``fio_staggered`` against ``fio_convoy``: fio at the same queue depth as it
  runs by default (it reaps what is there and resubmits each request at once,
  so requests stay spread in time) and with
  ``--iodepth_batch_submit=QD --iodepth_batch_complete_min=QD`` (it waits for
  the whole batch, then resubmits it: every request in one convoy), in
  interleaved pairs. The figure is the convoy's IOPS with the staggered rate as
  its ceiling: what a perfect engine that moves in batches can reach there.

Usage: python benchmarks/io/bench_batching.py [--dir DIR] [--size 1G] [--qd 32] [--pairs 4] [--seconds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk_ceiling import fio_memory, fio_read_cmd

from carina.core.bench import Figure, make_record, write_record
from carina.io import IOConfig, IOEngine, aligned_buffer
from carina.io.backends._ring import OP_READ, Ring
from carina.io.workload import fill_file, parse_size


def batch_latency(path: Path, size: int, n: int, trials: int) -> dict[str, Any]:
    """Submit ``n`` random 4 KiB reads with one enter; times (us) of the first and last completion, groups."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    ring = Ring(1 << n.bit_length())
    buf = aligned_buffer(4096 * n)
    rng = np.random.default_rng(n)
    rows = np.arange(n, dtype=np.uint64)
    out: list[dict[str, float]] = []
    try:
        for _ in range(trials):
            offsets = (rng.integers(0, size // 4096, n) * 4096).astype(np.uint64)
            addrs = np.uint64(buf.ctypes.data) + rows * np.uint64(4096)
            ring.put(Ring.entries(OP_READ, fd, offsets, addrs, np.full(n, 4096), rows))
            t0 = time.perf_counter()
            ring.enter(0)
            got, groups, first = 0, 0, 0.0
            while got < n:
                ring.enter(0)
                user, res = ring.completion_arrays()
                if len(user):
                    assert (res == 4096).all(), res
                    first = first or time.perf_counter() - t0
                    got, groups = got + len(user), groups + 1
            out.append({"first_us": first * 1e6, "last_us": (time.perf_counter() - t0) * 1e6, "groups": groups})
    finally:
        ring.close()
        os.close(fd)
    return {
        "trials": out,
        "first_us_median": statistics.median(t["first_us"] for t in out),
        "last_us_median": statistics.median(t["last_us"] for t in out),
        "groups_median": statistics.median(t["groups"] for t in out),
    }


def fio_iops(fio: str, path: Path, size: int, qd: int, seconds: float, convoy: bool) -> float:
    """fio's 4 KiB random-read IOPS, staggered (default) or in convoys of ``qd``."""
    cmd, _ = fio_read_cmd(fio, str(path), size, rw="randread", block=4096, depth=qd, seconds=seconds)
    if convoy:
        cmd += [f"--iodepth_batch_submit={qd}", f"--iodepth_batch_complete_min={qd}"]
    job = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["jobs"][0]
    return float(job["read"]["iops"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--size", default="1G")
    p.add_argument("--qd", type=int, default=32)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--trials", type=int, default=8, help="batches per batch size")
    p.add_argument("--fio", default=None)
    p.add_argument("--name", default="io_batching")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    fio = args.fio or shutil.which("fio")
    if not fio:
        sys.exit("fio is needed: apt-get install -y fio")
    size = parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="carina-batching-", dir=args.dir))
    metrics: dict[str, Any] = {"loadavg_1min_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    try:
        path = work / "data.bin"
        with IOEngine(IOConfig(backend="uring")) as eng:
            fill_file(eng, eng.open(path, "w"), size)
        metrics["batch_latency"] = {str(n): batch_latency(path, size, n, args.trials) for n in (8, 32, 128)}
        pairs = []
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            pair = {
                ("convoy" if c else "staggered"): fio_iops(fio, path, size, args.qd, args.seconds, c) for c in order
            }
            pairs.append(pair)
            print(f"pair {i}: {json.dumps(pair)}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    metrics["loadavg_1min_end"] = os.getloadavg()[0]
    metrics["fio_pairs"] = pairs
    staggered = statistics.median(t["staggered"] for t in pairs)
    convoy = statistics.median(t["convoy"] for t in pairs)
    metrics["pair_ratio_median"] = statistics.median(t["convoy"] / t["staggered"] for t in pairs)
    for n, b in metrics["batch_latency"].items():
        print(f"batch of {n}: first completion {b['first_us_median']:.0f} us, last {b['last_us_median']:.0f} us, "
              f"{b['groups_median']:.0f} groups (medians)")  # fmt: skip
    print(
        f"fio QD{args.qd}: staggered {staggered:.0f} IOPS, convoys of {args.qd} {convoy:.0f} ({convoy / staggered:.0%})"
    )
    fig = Figure(
        name=f"fio_convoy_qd{args.qd}",
        value=convoy,
        unit="IOPS",
        ceiling=staggered,
        ceiling_source=f"fio io_uring O_DIRECT 4 KiB randread iodepth={args.qd}, {fio_memory(4096, args.qd)[1]}, "
        "with its default (staggered) "
        f"submission, same file, median of {args.pairs} runs interleaved with the convoy runs",
    )
    record = make_record(
        name=args.name,
        figures=[fig],
        config={"size": size, "qd": args.qd, "pairs": args.pairs, "seconds": args.seconds, "trials": args.trials},
        metrics=metrics,
        notes="Diagnostic of the disk, not of carina: batch_latency submits n reads with one io_uring_enter and "
        "times their completions; the figure is fio moving in whole-queue batches (convoys) against fio's "
        "default staggered loop. metrics.loadavg_1min_* is the shared machine's load around the run.",
    )
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
