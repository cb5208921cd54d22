"""Recompute an interleaved-block overhead record's summary from its own step times.

``bench_overhead_paired.py`` keeps every step time of every block in ``metrics.methods``;
its summary rows are a function of them (``bench_overhead_paired.summarize``). When that
function gains a column (session 8: ``blocking_pct``, ``in_flight_step_pct``,
``after_step_pct``, ``flight_minus_after_step_pct``), this script rewrites the summary
of a record made before, in place: machine, environment, command, figures and step times stay; the notes say which
script recomputed it at which commit. The figures are unchanged because the same code
computes them.

    python benchmarks/ckpt/resummarize_overhead_paired.py benchmarks/results/h200/ckpt_overhead_paired_h200_s8.json
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_overhead_paired import summarize


def main() -> None:
    path = Path(sys.argv[1])
    rec = json.loads(path.read_text())
    metrics = rec["metrics"]
    rows = [summarize(name, out, metrics["persist_s"])
            for name, res in metrics["methods"].items() for out in res["intervals"].values()]  # fmt: skip
    for old, new in zip(metrics["summary"], rows, strict=True):
        changed = [k for k in old if k in new and old[k] != new[k]]
        if changed:
            raise SystemExit(f"{path}: recomputed {changed} differ from the record's; not rewritten")
    metrics["summary"] = rows
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    note = (f" Summary recomputed from the record's own step times by "
            f"benchmarks/ckpt/resummarize_overhead_paired.py at {sha} (added blocking_pct, in_flight_step_pct, "
            "after_step_pct, flight_minus_after_step_pct and its interval; every other value as the run "
            "computed it).")  # fmt: skip
    if note not in rec["notes"]:
        rec["notes"] += note
    path.write_text(json.dumps(rec, indent=2) + "\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
