"""The launch thread's host steps per batch, new against base: medians of two bench_batch_host records.

No new measurement: reads the records that ``bench_batch_host.py --trees base=...,new=...`` wrote (the two
trees ran interleaved, A B A B) and writes, per batch size, block size and operation, the median of every
step over the rounds for each tree and new / base::

    python benchmarks/infra_storage/derive_batch_host.py \\
        --base benchmarks/results/cpu/infra_storage_batch_host_s13_base.json \\
        --new benchmarks/results/cpu/infra_storage_batch_host_s13.json --name infra_storage_batch_host_s13_vs_base
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from carina.core.bench import Basis, Figure, load_records, make_record, write_record

COLS = ("host", "plan", "upload", "download", "scatter", "device")


def summarise(base: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ``(requests, block, op)``: each tree's median µs per batch of each step, and new / base."""
    out = []
    for key in sorted({(r["requests"], r["block"], r["op"]) for r in new}):
        row: dict[str, Any] = {"requests": key[0], "block": key[1], "op": key[2]}
        for col in COLS:
            b, n = (statistics.median(r[f"{col}_cpu_us"] for r in rows if (r["requests"], r["block"], r["op"]) == key)
                    for rows in (base, new))  # fmt: skip
            row |= {f"{col}_base_us": b, f"{col}_new_us": n, f"{col}_x": n / b if b else None}
        row["host_new_us_per_req"] = row["host_new_us"] / key[0]
        row["rounds"] = sum(1 for r in new if (r["requests"], r["block"], r["op"]) == key)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--name", default="infra_storage_batch_host_vs_base")
    args = ap.parse_args()
    (base,), (new,) = load_records([args.base]), load_records([args.new])
    rows = summarise(base["metrics"]["rows"], new["metrics"]["rows"])
    figs = [Figure(name=f"{r['op']}_{r['block'] >> 10}k_{r['requests']}req_host_x", value=r["host_x"], unit="x",
                   higher_is_better=False, basis=Basis.DERIVED) for r in rows]  # fmt: skip
    notes = (f"Derived from {base['name']} (git {base['git_sha'][:7]}) and {new['name']} (git {new['git_sha'][:7]}), "
             "no new measurement. CPU machine, host steps only: not a GPU measurement. 'x' is new / base "
             "(below 1: less host CPU per batch). host = the batch's thread CPU minus the device step.")  # fmt: skip
    record = make_record(name=args.name, figures=figs, config=vars(args), command=["python", *sys.argv],
                         metrics={"rows": rows, "sources": [base["name"], new["name"]]}, notes=notes)  # fmt: skip
    print("record:", write_record(record))


if __name__ == "__main__":
    main()
