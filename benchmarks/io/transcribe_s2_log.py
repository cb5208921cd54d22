"""Make labelled records from the log of the second H100 device call, whose JSON records were lost.

``h100_s2.sh`` (at commit 949a4ce) wrote its records to /tmp on the device and gathered them only at the
end; the lane's time limit killed it during the GEMM step, so only its log came back. This script turns
the figures printed in that log, and nothing else, into two records: the 4 KiB random-read pairs
(``io_randread_h100``: every printed pair, and medians computed from them) and the external sort
(``io_sort_h100_s2``: the one printed line, GB/s and percent of the disk-bound floor).

Usage: python benchmarks/io/transcribe_s2_log.py /work/gpu/call4/io/io_s2.log [benchmarks/results/h100]
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from carina.core.bench import Figure, make_record, write_record

COMMAND = (
    "OUT=$OUT bash benchmarks/h100_combined.sh ckpt=benchmarks/ckpt/h100_s2.sh:120 "
    "faults=benchmarks/security_faults/h100_s2.sh:95 gnn=benchmarks/gnn/h100_s2.sh:110 "
    "disagg=benchmarks/offload/disagg_h100_s2.sh:90 io=benchmarks/io/h100_s2.sh:80 "
    "storage=benchmarks/infra_storage/h100_s2.sh:45"
)
DEVICE_SHA = "949a4ce86acd582e2ef3628bd94e906a15a04f5c"
ENVIRONMENT = {"machine": "H100 80GB HBM3 device machine, torch 2.11.0+cu130", "note": "not captured"}
PAIR = re.compile(r"^qd(\d+) pair (\d+): (\{.*\})$")
SORT = re.compile(r"^([0-9.]+) GB/s, (\d+)% of the disk-bound floor$")


def notes(log: Path, what: str) -> str:
    return (
        f"Transcribed from {log.name} (/work/gpu/call4/io/io_s2.log) of the device call; the script's JSON "
        "was written to /tmp on the device and lost when the step limit killed it. "
        f"{what} Device call run at main commit {DEVICE_SHA[:7]} with .whl-io and .debs-io carried "
        "(fio-3.33 unpacked from them); 'created' is the time of transcription."
    )


def label(record: dict[str, Any]) -> dict[str, Any]:
    record["machine"] = {"label": "h100", "hostname": "not captured"}
    record["git_sha"], record["git_dirty"] = DEVICE_SHA, False
    return record


def randread(log: Path, lines: list[str]) -> dict[str, Any]:
    """The interleaved pairs, per depth: every printed pair, medians and carina/fio ratios."""
    pairs: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        if m := PAIR.match(line):
            pairs.setdefault(int(m[1]), []).append({"pair": int(m[2]), **json.loads(m[3])})
    if not pairs:
        sys.exit(f"{log}: no 'qdN pair i:' lines")
    metrics: dict[str, Any] = {"fio": True, "pairs": [], "per_depth": []}
    figures = []
    for qd, trials in sorted(pairs.items()):
        for t in trials:
            order = "fio first" if next(iter(k for k in t if k != "pair")) == "fio" else "carina first"
            metrics["pairs"].append({
                "depth": qd, "pair": t["pair"], "order": order,
                "fio_iops": t["fio"]["iops"], "fio_cores": t["fio"]["cores"],
                "carina_iops": t["carina"]["iops"], "carina_cores": t["carina"]["cores"],
                "carina_over_fio": t["carina"]["iops"] / t["fio"]["iops"],
            })  # fmt: skip
        med = {
            k: statistics.median(t[who][f] for t in trials)
            for k, who, f in [("carina_iops_median", "carina", "iops"), ("fio_iops_median", "fio", "iops"),
                              ("carina_cores_median", "carina", "cores"), ("fio_cores_median", "fio", "cores")]
        }  # fmt: skip
        med["pair_ratio_median"] = statistics.median(t["carina"]["iops"] / t["fio"]["iops"] for t in trials)
        med["ratio_of_medians"] = med["carina_iops_median"] / med["fio_iops_median"]
        metrics[f"qd{qd}"] = {"trials": trials, **med}
        metrics["per_depth"].append({"depth": qd, "pairs": len(trials), **med})
        figures.append(
            Figure(
                name=f"rand_read_4KiB_qd{qd}",
                value=med["carina_iops_median"],
                unit="IOPS",
                ceiling=med["fio_iops_median"],
                ceiling_source=f"fio-3.33 io_uring O_DIRECT 4 KiB randread iodepth={qd}, same file, median of "
                f"{len(trials)} 1 s runs interleaved with carina's (transcribed from the log)",
            )
        )
    config = {"size": 1 << 30, "depths": sorted(pairs), "pairs": 4, "seconds": 1.0, "rows": 2048,
              "source": "bench_randread.py --size 1G --depths 32,128 --pairs 4 --seconds 1 (h100_s2.sh)"}  # fmt: skip
    what = (
        "Every 'qdN pair i' line is kept as printed; medians and carina/fio ratios are computed here from "
        "those lines. The final byte-checking pass ran (the script asserts it checked bytes before writing "
        "its record, and the step ended rc=0) but its byte count was not printed. verified_bytes 0.0 in the "
        "pairs is the timed runs, which do not check."
    )
    rec = make_record(name="io_randread_h100", figures=figures, config=config, command=COMMAND,
                      metrics=metrics, notes=notes(log, what), environment=ENVIRONMENT)  # fmt: skip
    return label(rec)


def sort(log: Path, lines: list[str]) -> dict[str, Any]:
    """The external sort's one printed line: GB/s and percent of the disk-bound floor."""
    found = [m for line in lines if (m := SORT.match(line))]
    if len(found) != 1:
        sys.exit(f"{log}: expected one sort line, found {len(found)}")
    gbps, pct = float(found[0][1]), int(found[0][2])
    figures = [
        Figure(name="external_sort", value=gbps, unit="GB/s", ceiling=None,
               ceiling_source="disk-bound floor: not printed in the log (only the ratio below)"),
        Figure(name="external_sort_fraction_of_disk_bound_floor", value=pct / 100, unit="fraction",
               ceiling=None, ceiling_source="printed as a whole percent by bench_sort.py"),
    ]  # fmt: skip
    config = {"size": 2 << 30, "budget": 512 << 20, "ceiling_seconds": 2.0, "device": "cuda",
              "source": "bench_sort.py --size 2G --budget 512M --ceiling-seconds 2 (h100_s2.sh)"}  # fmt: skip
    what = (
        f"Only the printed line '{found[0][0]}' is recorded; the read/write rates, the floor, the phase times "
        "and the synchronous peer were in the lost JSON. bench_sort.py prints that line only after the "
        "output was checked (sorted, same count/sum/xor/sum of squares), else it exits non-zero."
    )
    rec = make_record(name="io_sort_h100_s2", figures=figures, config=config, command=COMMAND,
                      metrics={"printed": found[0][0]}, notes=notes(log, what), environment=ENVIRONMENT)  # fmt: skip
    return label(rec)


def main() -> None:
    log = Path(sys.argv[1])
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("benchmarks/results/h100")
    lines = log.read_text().splitlines()
    for rec in (randread(log, lines), sort(log, lines)):
        print(write_record(rec, directory=dest))


if __name__ == "__main__":
    main()
