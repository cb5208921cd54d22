"""4 KiB random reads: carina's ``uring`` engine against fio, in interleaved pairs.

On a shared or virtual machine the disk's rate drifts from second to second,
so one fio run followed by one carina run compares two different disks. This
benchmark alternates short fio and carina runs on the same file (``O_DIRECT``,
4 KiB random reads, the same queue depth, fio's ``io_uring`` engine) and
reports the median carina rate, the median fio rate and the median of the
per-pair ratios (the figure's "vs ceiling" is the ratio of medians; the
per-pair median is in ``metrics``). Carina streams ``IOEngine.gather`` calls
of ``--rows`` rows, two at a time, with the engine's ``queue_depth`` equal to
fio's ``iodepth`` (at most that many requests in the kernel). A last pass
checks every byte read against the file's pattern. Without fio the carina
rates are recorded with no ceiling.

Usage: python benchmarks/io/bench_randread.py [--dir DIR] [--size 1G] [--depths 32,128] [--pairs 5] [--seconds 2]
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

from carina.core.bench import Figure, make_record, write_record
from carina.io import IOConfig, IOEngine
from carina.io.workload import Access, fill_file, parse_size, run_case

BLOCK = 4096


def fio_rate(fio: str, path: Path, size: int, qd: int, seconds: float) -> dict[str, float]:
    """fio's 4 KiB random-read IOPS and CPU use (cores) on ``path``."""
    cmd = [
        fio,
        "--name=ceiling",
        f"--filename={path}",
        f"--size={size}",
        "--direct=1",
        "--readonly",
        "--rw=randread",
        f"--bs={BLOCK}",
        "--ioengine=io_uring",
        f"--iodepth={qd}",
        "--time_based",
        f"--runtime={max(1, round(seconds))}",
        "--output-format=json",
    ]
    job = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["jobs"][0]
    return {"iops": float(job["read"]["iops"]), "cores": (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100}


def carina_rate(engine: IOEngine, handle: Any, qd: int, seconds: float, rows: int, verify: bool) -> dict[str, float]:
    """carina's IOPS and CPU use (cores, whole process) over one timed run."""
    t0 = os.times()
    res = run_case(
        engine,
        handle,
        kind="read",
        access=Access.RAND,
        block=BLOCK,
        queue_depth=qd,
        seconds=seconds,
        verify=verify,
        rows=rows,
    )
    t1 = os.times()
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    return {"iops": res.iops, "cores": cpu / res.seconds, "verified_bytes": float(res.verified_bytes)}


def measure(fio: str | None, path: Path, size: int, qd: int, pairs: int, seconds: float, rows: int) -> dict[str, Any]:
    """Interleaved fio/carina pairs at one queue depth (the order flips every pair)."""
    trials: list[dict[str, Any]] = []
    with IOEngine(IOConfig(backend="uring", queue_depth=qd)) as engine:
        handle = engine.open(path, "r")
        carina_rate(engine, handle, qd, min(seconds, 0.5), rows, verify=False)  # warm-up
        for i in range(pairs):
            pair: dict[str, Any] = {}
            for who in ("fio", "carina") if i % 2 == 0 else ("carina", "fio"):
                if who == "fio" and fio:
                    pair["fio"] = fio_rate(fio, path, size, qd, seconds)
                elif who == "carina":
                    pair["carina"] = carina_rate(engine, handle, qd, seconds, rows, verify=False)
            trials.append(pair)
            print(f"qd{qd} pair {i}: {json.dumps(pair)}", file=sys.stderr)
        checked = carina_rate(engine, handle, qd, min(seconds, 1.0), rows, verify=True)
    assert checked["verified_bytes"] > 0
    out: dict[str, Any] = {
        "trials": trials,
        "carina_iops_median": statistics.median(t["carina"]["iops"] for t in trials),
        "carina_cores_median": statistics.median(t["carina"]["cores"] for t in trials),
        "verified_bytes": checked["verified_bytes"],
    }
    if fio:
        out["fio_iops_median"] = statistics.median(t["fio"]["iops"] for t in trials)
        out["fio_cores_median"] = statistics.median(t["fio"]["cores"] for t in trials)
        out["pair_ratio_median"] = statistics.median(t["carina"]["iops"] / t["fio"]["iops"] for t in trials)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk to test")
    parser.add_argument("--size", default="1G")
    parser.add_argument("--depths", default="32,128")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rows", type=int, default=2048, help="rows per gather (two gathers in flight)")
    parser.add_argument("--fio", default=None, help="fio binary (default: fio on PATH; 'none': no ceiling)")
    parser.add_argument("--name", default="io_randread")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    fio = None if args.fio == "none" else (args.fio or shutil.which("fio"))
    if not fio:
        print("fio not found: carina rates only, no ceiling", file=sys.stderr)
    size = parse_size(args.size)
    depths = [int(x) for x in args.depths.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="carina-randread-", dir=args.dir))
    path = workdir / "data.bin"
    results: dict[str, Any] = {"fio": bool(fio)}
    try:
        with IOEngine(IOConfig(backend="uring", queue_depth=32)) as engine:
            fill_file(engine, engine.open(path, "w"), size)
        for qd in depths:
            r = results[f"qd{qd}"] = measure(fio, path, size, qd, args.pairs, args.seconds, args.rows)
            print(  # the key figures reach the log even if the record is lost
                f"qd{qd}: carina {r['carina_iops_median']:.0f} IOPS ({r['carina_cores_median']:.2f} cores), "
                + (f"fio {r['fio_iops_median']:.0f} ({r['fio_cores_median']:.2f} cores), "
                   f"ratio {r['carina_iops_median'] / r['fio_iops_median']:.0%}, per-pair median "
                   f"{r['pair_ratio_median']:.0%}" if fio else "no fio")
                + f"; {r['verified_bytes']:.0f} bytes checked"
            )  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    figures = [
        Figure(
            name=f"rand_read_4KiB_qd{qd}",
            value=results[f"qd{qd}"]["carina_iops_median"],
            unit="IOPS",
            ceiling=results[f"qd{qd}"].get("fio_iops_median"),
            ceiling_source=(
                f"fio io_uring O_DIRECT 4 KiB randread iodepth={qd}, same file, median of {args.pairs} runs "
                "interleaved with carina's"
                if fio
                else "none: fio not installed"
            ),
        )
        for qd in depths
    ]
    config = {"size": size, "depths": depths, "pairs": args.pairs, "seconds": args.seconds, "rows": args.rows}
    record = make_record(
        name=args.name,
        figures=figures,
        config=config,
        metrics=results,
        notes="Medians of interleaved short runs; pair_ratio_median is the median of carina/fio per pair. "
        "A final pass checked every byte carina read.",
    )
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
