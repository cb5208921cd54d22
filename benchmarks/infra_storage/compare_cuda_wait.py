"""Spinning against blocking CUDA waits for the GPU engines, derived from committed tier records (no new measurement).

Session 8's run (``--run``) holds each GPU engine twice behind the same front ends, ``<engine>-fe4`` (CUDA's default
wait) and ``<engine>-bsync-fe4`` (``--cuda-wait block``); session 7's run (``--before``) holds the spinning systems
only. For every engine, block size and load this writes one row: MB/s, server CPU-seconds per GB, the cores the
server kept busy (MB/s x CPU-s/GB), host CPU per request (CPU-s/GB x block) and the mean request latency at queue
depth 32 by Little's law (32 x block / throughput; qemu-img bench reports no latencies), for both waits. A second
list has the fill's wall and CPU seconds per system: a cost that does not grow with the block size is paid per
server, not per byte. Run from the repository root::

    python benchmarks/infra_storage/compare_cuda_wait.py \
        --run benchmarks/results/h200/infra_storage_tier_h200_fe_lz4.json \
        --before benchmarks/results/h200/s7/infra_storage_tier_h200_fe_lz4.json --name infra_storage_cuda_wait_s8
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from carina.core.bench import Basis, Figure, load_records, make_record, write_record

OPS = ("read", "write_const", "fill")
QD = 32


def _rows(path: Path) -> tuple[dict[tuple[str, int], dict[str, Any]], dict[str, Any]]:
    [rec] = load_records(path)
    return {(r["system"], int(r["block"])): r for r in rec["metrics"]["rows"]}, rec


def _side(row: dict[str, Any] | None, op: str, block: int) -> dict[str, float | None]:
    if row is None:
        return {"mb_s": None, "cpu_s_per_gb": None, "cores": None, "host_us_per_req": None, "qd32_latency_us": None}
    mb, cpu = float(row[f"{op}_mb_s"]), float(row[f"{op}_cpu_s_per_gb"])
    per_req = op != "fill"  # fill requests are qemu-img convert's, not one block each
    return {"mb_s": mb, "cpu_s_per_gb": cpu, "cores": mb * cpu / 1e3,
            "host_us_per_req": cpu * block / 1e3 if per_req else None,
            "qd32_latency_us": QD * block / mb if per_req else None}  # fmt: skip


def wait_rows(run: dict, before: dict, engines: list[str], fe: int) -> list[dict[str, Any]]:
    """One row per engine, block and load: spin (this run and ``before``) against block."""
    out = []
    for engine in engines:
        for block in sorted({b for _, b in run}):
            for op in OPS:
                spin = _side(run.get((f"{engine}-fe{fe}", block)), op, block)
                blk = _side(run.get((f"{engine}-bsync-fe{fe}", block)), op, block)
                old = _side(before.get((f"{engine}-fe{fe}", block)), op, block)
                row: dict[str, Any] = {"engine": engine, "block": block, "op": op, "s7_spin_mb_s": old["mb_s"],
                                       "s7_spin_cpu_s_per_gb": old["cpu_s_per_gb"]}  # fmt: skip
                row |= {f"spin_{k}": v for k, v in spin.items()} | {f"block_{k}": v for k, v in blk.items()}
                for k in ("mb_s", "cpu_s_per_gb"):
                    s, b = spin[k], blk[k]
                    row[f"block_over_spin_{k}"] = b / s if s and b else None
                out.append({k: v for k, v in row.items() if v is not None})  # not applicable: no cell
    return out


def fill_rows(run: dict, data_bytes: int) -> list[dict[str, Any]]:
    """Wall and CPU seconds of each system's fill of ``data_bytes``, per block size."""
    out = []
    for (system, block), r in sorted(run.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        secs = data_bytes / (float(r["fill_mb_s"]) * 1e6)
        out.append({"system": system, "block": block, "fill_s": secs,
                    "fill_cpu_s": float(r["fill_cpu_s_per_gb"]) * data_bytes / 1e9})  # fmt: skip
    return out


def _figures(rows: list[dict[str, Any]]) -> list[Figure]:
    figs = []
    for r in rows:
        tag = f"{r['engine']}_{r['op']}_{r['block'] // 1024}k"
        for k, unit in (("cpu_s_per_gb", "x"), ("mb_s", "x")):
            v = r[f"block_over_spin_{k}"]
            if v is not None:
                figs.append(Figure(name=f"{tag}_block_over_spin_{k}", value=v, unit=unit, basis=Basis.DERIVED,
                                   higher_is_better=k == "mb_s",
                                   ceiling_source="derived: same run, same cores, same front ends"))  # fmt: skip
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="the record with <engine>-fe<N> and -bsync systems")
    ap.add_argument("--before", type=Path, required=True, help="an earlier record of the spinning systems")
    ap.add_argument("--engines", default="torch,nvcomp")
    ap.add_argument("--frontends", type=int, default=4)
    ap.add_argument("--name", default="infra_storage_cuda_wait_s8")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    args = ap.parse_args()
    run, rec = _rows(args.run)
    before, old = _rows(args.before)
    rows = wait_rows(run, before, args.engines.split(","), args.frontends)
    fills = fill_rows(run, int(rec["config"]["data"]))
    notes = (f"Derived, no new measurement: rows of {rec['name']} at {rec['git_sha'][:7]} (spin and block, one run) "
             f"and of {old['name']} at {old['git_sha'][:7]} (spin, an earlier run). cores = MB/s x CPU-s/GB / 1000; "
             f"host_us_per_req = CPU-s/GB x block; qd32_latency_us = {QD} x block / MB/s (Little's law).")  # fmt: skip
    record = make_record(name=args.name, figures=_figures(rows), config=vars(args) | {"engines": args.engines},
                         metrics={"rows": rows, "fills": fills}, notes=notes,
                         command=["compare_cuda_wait.py", "--run", str(args.run), "--before", str(args.before),
                                  "--name", args.name])  # fmt: skip
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
