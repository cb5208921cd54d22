"""Why fio read below carina for large blocks: fio's buffers, 4 KiB pages against huge pages.

A diagnostic of the ceiling, not of carina. For each case (``seq1M@32``,
``seq4M@32``, ``rand4K@32``) it runs fio twice per pair on one file, once with
its default buffers (4 KiB pages) and once with ``--iomem=mmaphuge`` (2 MiB
huge pages; needs ``/proc/sys/vm/nr_hugepages`` reserved, which ``lane_h200.sh``
does), the order flipped every pair, and counts the read requests that reached
the block device during each run (``/sys/block/<dev>/stat``; other processes'
reads on a shared disk are counted too). A large read in 4 KiB pages has more
physical segments than a virtio request takes (``max_segments``, recorded), so
it is split: more device requests per fio read and a lower rate. The figure is
fio's median rate with huge pages; its peer is the same with 4 KiB pages.

Usage: python benchmarks/io/bench_fio_buffers.py --dir DIR [--size 1G] [--pairs 3] [--seconds 1]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_randread import Case, parse_cases
from disk_ceiling import block_limits, find_fio, fio_memory

from carina.core.bench import Figure, make_record, write_record
from carina.io import IOConfig, IOEngine
from carina.io.workload import Access, fill_file, parse_size


def device_reads(limits: dict[str, Any]) -> tuple[int, int]:
    """Reads completed and sectors read so far on the device named in ``limits`` ((0, 0) if unknown)."""
    stat = Path("/sys/block") / str(limits.get("device", "")) / "stat"
    if not limits.get("device") or not stat.exists():
        return 0, 0
    fields = stat.read_text().split()
    return int(fields[0]), int(fields[2])


def one_run(fio: str, path: Path, size: int, case: Case, seconds: float, huge: bool, limits: dict[str, Any]) -> dict:
    """One fio run: rate, fio's reads and the device's read requests during it."""
    memory, words = fio_memory(case.block, case.qd) if huge else ([], "4 KiB-page buffers")
    if huge and not memory:
        return {"skipped": words}
    cmd = [fio, "--name=buffers", f"--filename={path}", f"--size={size}", "--direct=1", "--readonly",
           "--rw=randread" if case.access is Access.RAND else "--rw=read", f"--bs={case.block}",
           "--ioengine=io_uring", f"--iodepth={case.qd}", "--time_based", f"--runtime={max(1, round(seconds))}",
           "--output-format=json", *memory]  # fmt: skip
    before = device_reads(limits)
    job = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["jobs"][0]["read"]
    after = device_reads(limits)
    reqs, sectors = after[0] - before[0], after[1] - before[1]
    return {
        "buffers": words,
        "bytes_per_s": float(job["bw_bytes"]),
        "iops": float(job["iops"]),
        "fio_reads": int(job["total_ios"]),
        "device_read_requests": reqs,
        "device_requests_per_read": reqs / job["total_ios"] if job["total_ios"] else None,
        "device_kib_per_request": sectors * 512 / 1024 / reqs if reqs else None,
    }


def measure(fio: str, path: Path, size: int, case: Case, pairs: int, seconds: float, limits: dict) -> dict:
    """Interleaved pairs of fio with 4 KiB-page and huge-page buffers for one case."""
    trials = []
    for i in range(pairs):
        pair = {}
        for huge in (False, True) if i % 2 == 0 else (True, False):
            pair["huge" if huge else "small"] = one_run(fio, path, size, case, seconds, huge, limits)
        trials.append(pair)
        print(f"{case.figure} pair {i}: {json.dumps(pair)}", file=sys.stderr)
    out: dict[str, Any] = {"trials": trials}
    for kind in ("small", "huge"):
        runs = [t[kind] for t in trials if "bytes_per_s" in t[kind]]
        if runs:
            out[f"{kind}_bytes_per_s_median"] = statistics.median(r["bytes_per_s"] for r in runs)
            out[f"{kind}_iops_median"] = statistics.median(r["iops"] for r in runs)
            per = [r["device_requests_per_read"] for r in runs if r["device_requests_per_read"]]
            out[f"{kind}_device_requests_per_read_median"] = statistics.median(per) if per else None
    return out


def _figure(case: Case, r: dict[str, Any]) -> Figure | None:
    if "huge_bytes_per_s_median" not in r:
        return None
    rand = case.access is Access.RAND
    key = "iops_median" if rand else "bytes_per_s_median"
    scale = 1.0 if rand else 1e-9
    return Figure(
        name=f"fio_{case.figure}_hugepage_buffers",
        value=r[f"huge_{key}"] * scale,
        unit="IOPS" if rand else "GB/s",
        ceiling=None,
        ceiling_source="diagnostic: no ceiling (fio against fio)",
        peers={"fio_4KiB_page_buffers": r[f"small_{key}"] * scale},
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--size", default="1G")
    p.add_argument("--cases", default="seq1M@32,seq4M@32,rand4K@32")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--fio", default=None)
    p.add_argument("--name", default="io_fio_buffers")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    fio = find_fio(args.fio)
    if not fio:
        sys.exit("fio is needed: apt-get install -y fio")
    size, cases = parse_size(args.size), parse_cases(args.cases)
    work = Path(tempfile.mkdtemp(prefix="carina-fiobuf-", dir=args.dir))
    path = work / "data.bin"
    limits = block_limits(work)
    results: dict[str, Any] = {"block_limits": limits, "loadavg_1min_start": os.getloadavg()[0]}
    try:
        with IOEngine(IOConfig(backend="auto")) as engine:
            fill_file(engine, engine.open(path, "w"), size)
        for case in cases:
            r = results[case.figure] = measure(fio, path, size, case, args.pairs, args.seconds, limits)
            print(f"{case.figure}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items() if k != "trials" and v))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["loadavg_1min_end"] = os.getloadavg()[0]
    figures = [f for f in (_figure(c, results[c.figure]) for c in cases) if f is not None]
    cfg = {"size": size, "cases": [c.figure for c in cases], "pairs": args.pairs, "seconds": args.seconds}
    record = make_record(
        name=args.name,
        figures=figures,
        config=cfg,
        metrics=results,
        notes="Diagnostic of fio's ceiling: the same fio job with 4 KiB-page and with huge-page buffers, interleaved; "
        "device_requests_per_read counts every read request the block device completed during the run "
        "(other processes' reads included). metrics.block_limits: the device's request limits and the THP mode.",
    )
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
