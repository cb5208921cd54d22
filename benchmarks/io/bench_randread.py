"""Reads through carina's engine against fio, in interleaved pairs (4 KiB random, 1 MiB sequential).

On a shared or virtual machine the disk's rate drifts from second to second,
so one fio run followed by one carina run compares two different disks. This
benchmark alternates short fio and carina runs on the same file (``O_DIRECT``,
the same block size, access order and queue depth, fio's ``io_uring`` engine)
and reports the median carina rate, the median fio rate and the median of the
per-pair ratios (the figure's "vs ceiling" is the ratio of medians; the
per-pair median is in ``metrics``). A case is ``rand4K@32`` (random 4 KiB
reads at queue depth 32) or ``seq1M@32``; ``--depths`` is shorthand for
random 4 KiB cases. Carina streams ``IOEngine.gather`` calls of ``--rows``
rows (at most 128 MiB each), two at a time, with the engine's ``queue_depth``
equal to fio's ``iodepth`` (at most that many requests in the kernel). A last
pass checks every byte read against the file's pattern. Without fio the
carina rates are recorded with no ceiling. The file is dropped from the page
cache before every carina run and its resident share measured after it
(``resident_after``; ``O_DIRECT`` reads leave it near 0); a case whose runs
left more than 5% resident says so in its ceiling source, and a backend's
``direct_io`` report (kvikio's settings) is kept in the case's metrics.

Usage: python benchmarks/io/bench_randread.py [--dir DIR] [--size 1G] [--cases rand4K@32,seq1M@32]
       [--backend uring] [--pairs 5] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk_ceiling import block_limits, fio_read_cmd

from carina.core.bench import Figure, make_record, write_record
from carina.core.errors import ConfigError
from carina.io import IOConfig, IOEngine, drop_cache, resident_fraction
from carina.io.workload import Access, fill_file, parse_size, run_case


@dataclass(frozen=True)
class Case:
    """One measured case: access order, block size, queue depth."""

    access: Access
    block: int
    qd: int

    @property
    def key(self) -> str:
        """Metrics key (``qd32`` for random 4 KiB reads, as in earlier records)."""
        return f"qd{self.qd}" if (self.access, self.block) == (Access.RAND, 4096) else self.figure

    @property
    def figure(self) -> str:
        """Figure name, the same as ``bench_engine.py``'s."""
        return f"{self.access.value}_read_{self.block >> 10}KiB_qd{self.qd}"


def parse_cases(text: str) -> list[Case]:
    """``rand4K@32,seq1M@32`` -> cases.

    Raises:
        ConfigError: A case is not ``rand|seq<size>@<depth>``.
    """
    cases = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        match = re.fullmatch(r"(rand|seq)(\w+)@(\d+)", item)
        if not match:
            raise ConfigError(f"case {item!r} is not like rand4K@32 or seq1M@32", key="cases")
        cases.append(Case(access=Access(match.group(1)), block=parse_size(match.group(2)), qd=int(match.group(3))))
    return cases


def fio_rate(fio: str, path: Path, size: int, case: Case, seconds: float) -> dict[str, Any]:
    """fio's IOPS, bandwidth and CPU use (cores) for ``case`` on ``path`` (huge-page buffers where reserved)."""
    rw = "randread" if case.access is Access.RAND else "read"
    cmd, words = fio_read_cmd(fio, str(path), size, rw=rw, block=case.block, depth=case.qd, seconds=seconds)
    job = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["jobs"][0]
    read = job["read"]
    cores = (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100
    return {"iops": float(read["iops"]), "bytes_per_s": float(read["bw_bytes"]), "cores": cores, "buffers": words}


def carina_rate(engine: IOEngine, handle: Any, case: Case, seconds: float, rows: int, verify: bool) -> dict[str, float]:
    """carina's IOPS, bandwidth and CPU use (cores, whole process) over one timed run."""
    t0 = os.times()
    res = run_case(
        engine,
        handle,
        kind="read",
        access=case.access,
        block=case.block,
        queue_depth=case.qd,
        seconds=seconds,
        verify=verify,
        rows=rows,
    )
    t1 = os.times()
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    return {
        "iops": res.iops,
        "bytes_per_s": res.bytes_per_s,
        "cores": cpu / res.seconds,
        "verified_bytes": float(res.verified_bytes),
    }


def measure(
    fio: str | None, path: Path, size: int, case: Case, pairs: int, seconds: float, rows: int, backend: str
) -> dict[str, Any]:
    """Interleaved fio/carina pairs for one case (the order flips every pair)."""
    trials: list[dict[str, Any]] = []
    rows = max(1, min(rows, (128 << 20) // case.block))
    with IOEngine(IOConfig(backend=backend, queue_depth=case.qd)) as engine:
        handle = engine.open(path, "r")
        carina_rate(engine, handle, case, min(seconds, 0.5), rows, verify=False)  # warm-up
        for i in range(pairs):
            pair: dict[str, Any] = {}
            for who in ("fio", "carina") if i % 2 == 0 else ("carina", "fio"):
                if who == "fio" and fio:
                    pair["fio"] = fio_rate(fio, path, size, case, seconds)
                elif who == "carina":
                    drop_cache(path)  # a buffered backend starts cold every run; O_DIRECT reads never fill it
                    pair["carina"] = carina_rate(engine, handle, case, seconds, rows, verify=False)
                    pair["carina"]["resident_after"] = resident_fraction(path)
            trials.append(pair)
            print(f"{case.key} pair {i}: {json.dumps(pair)}", file=sys.stderr)
        checked = carina_rate(engine, handle, case, min(seconds, 1.0), rows, verify=True)
    assert checked["verified_bytes"] > 0
    out: dict[str, Any] = {
        "trials": trials,
        "carina_iops_median": statistics.median(t["carina"]["iops"] for t in trials),
        "carina_bytes_per_s_median": statistics.median(t["carina"]["bytes_per_s"] for t in trials),
        "carina_cores_median": statistics.median(t["carina"]["cores"] for t in trials),
        "verified_bytes": checked["verified_bytes"],
        "rows_per_gather": rows,
        "backend": backend,
        "page_cache_resident_after_carina_max": max(t["carina"]["resident_after"] for t in trials),
        "backend_direct_io": getattr(engine.backend, "direct_io", None),
    }
    if fio:
        out["fio_iops_median"] = statistics.median(t["fio"]["iops"] for t in trials)
        out["fio_bytes_per_s_median"] = statistics.median(t["fio"]["bytes_per_s"] for t in trials)
        out["fio_cores_median"] = statistics.median(t["fio"]["cores"] for t in trials)
        out["pair_ratio_median"] = statistics.median(t["carina"]["iops"] / t["fio"]["iops"] for t in trials)
        out["fio_buffers"] = sorted({t["fio"]["buffers"] for t in trials})
    return out


def _figure(case: Case, r: dict[str, Any], pairs: int, fio: bool) -> Figure:
    rand = case.access is Access.RAND
    what = f"{'randread' if rand else 'read'} {case.block >> 10} KiB iodepth={case.qd}"
    cached = r["page_cache_resident_after_carina_max"]
    label = f"; carina's reads left up to {cached:.0%} of the file in the page cache" if cached > 0.05 else ""
    return Figure(
        name=case.figure,
        value=r["carina_iops_median"] if rand else r["carina_bytes_per_s_median"] / 1e9,
        unit="IOPS" if rand else "GB/s",
        ceiling=(r["fio_iops_median"] if rand else r["fio_bytes_per_s_median"] / 1e9) if fio else None,
        ceiling_source=(
            f"fio io_uring O_DIRECT {what}, {' / '.join(r['fio_buffers'])}, same file, median of {pairs} runs "
            f"interleaved with carina's{label}"
            if fio
            else f"none: fio not installed{label}"
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk to test")
    parser.add_argument("--size", default="1G")
    parser.add_argument("--depths", default="32,128", help="random 4 KiB cases at these depths (unless --cases)")
    parser.add_argument("--cases", default=None, help="e.g. rand4K@32,rand4K@128,seq1M@32")
    parser.add_argument("--backend", default="uring", help="carina backend (uring, posix, kvikio)")
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
    cases = parse_cases(args.cases or ",".join(f"rand4K@{d}" for d in args.depths.split(",")))
    workdir = Path(tempfile.mkdtemp(prefix="carina-randread-", dir=args.dir))
    path = workdir / "data.bin"
    results: dict[str, Any] = {"fio": bool(fio), "loadavg_1min_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    results["block_limits"] = block_limits(workdir)  # what splits large requests (see disk_ceiling.py)
    try:
        with IOEngine(IOConfig(backend="uring" if args.backend == "kvikio" else args.backend)) as engine:
            fill_file(engine, engine.open(path, "w"), size)
        for case in cases:
            r = results[case.key] = measure(fio, path, size, case, args.pairs, args.seconds, args.rows, args.backend)
            rate = f"{r['carina_iops_median']:.0f} IOPS, {r['carina_bytes_per_s_median'] / 1e9:.3f} GB/s"
            ref = f"{r['fio_iops_median']:.0f} IOPS, {r['fio_bytes_per_s_median'] / 1e9:.3f} GB/s" if fio else ""
            print(  # the key figures reach the log even if the record is lost
                f"{case.figure} ({args.backend}): carina {rate} ({r['carina_cores_median']:.2f} cores), "
                + (f"fio {ref} ({r['fio_cores_median']:.2f} cores), ratio "
                   f"{r['carina_iops_median'] / r['fio_iops_median']:.0%}, per-pair median "
                   f"{r['pair_ratio_median']:.0%}" if fio else "no fio")
                + f"; {r['verified_bytes']:.0f} bytes checked"
            )  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["loadavg_1min_end"] = os.getloadavg()[0]  # other jobs on a shared machine: see the notes
    figures = [_figure(case, results[case.key], args.pairs, bool(fio)) for case in cases]
    config = {
        "size": size,
        "cases": [c.figure for c in cases],
        "backend": args.backend,
        "pairs": args.pairs,
        "seconds": args.seconds,
        "rows": args.rows,
    }
    record = make_record(
        name=args.name,
        figures=figures,
        config=config,
        metrics=results,
        notes="Medians of interleaved short runs; pair_ratio_median is the median of carina/fio per pair. "
        "A final pass checked every byte carina read. metrics.loadavg_1min_* is the machine's load around the run "
        "(a shared machine: other jobs' IO and CPU move both fio and carina).",
    )
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
