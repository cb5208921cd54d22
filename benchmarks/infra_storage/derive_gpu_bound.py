"""Where a GPU engine could reach 3x the CPU tier on the same cores, derived from committed tier records (no new run).

Issue 12's GPU goal asks for 3x the CPU middle tier's throughput on the same CPU cores. Behind ``FE`` front ends
pinned to ``cores`` cores, three things bound any engine, and each comes from a measured row of the same run:

* **the ceiling**: ``forward-feFE`` does no payload work at all, so no engine behind the same front ends passes it;
  3x is out of reach wherever ``forward`` / ``inline-feFE`` (``ceiling_x``) is below 3;
* **host CPU**: at 3x ``inline-feFE``'s MB/s, ``cores`` cores leave ``cores / (3 x GB/s)`` CPU-seconds per GB
  (``budget_cpu_s_per_gb``; per request ``budget_us_per_req``, reads and writes only: a fill's requests are
  qemu-img convert's, not one block each); ``forward``'s own cost per request is the front end's share, the rest
  (``engine_budget_us_per_req``) is all a GPU path may add per request;
* **latency at queue depth ``qd``** (qemu-img bench shares ``qd`` over its clients): by Little's law each request's
  round trip must fit ``qd x block / (3 x MB/s)`` (``budget_qd_latency_us``).

Each row also holds what the GPU engines did in the run (MB/s, CPU-s/GB, µs per request, Little's-law latency).
A second list (``nvcomp``) puts the nvcomp engine's reads and writes from every record given side by side: with one
front end (sessions 4-5) and four (sessions 7-12), its requests per second, host CPU per request, the cores it kept
busy and its Little's-law round trip. Run from the repository root::

    python benchmarks/infra_storage/derive_gpu_bound.py \\
        --runs benchmarks/results/h200/s12/infra_storage_tier_h200_fe_deflate.json,\\
benchmarks/results/h200/s12/infra_storage_tier_h200_fe_lz4.json \\
        --nvcomp benchmarks/results/h200/s5/infra_storage_tier_h200_lz4.json,... --name infra_storage_gpu_bound_s12
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from carina.core.bench import Basis, Figure, load_records, make_record, write_record

OPS = ("read", "write_const", "fill")
TARGET = 3.0


def _load(path: Path) -> dict[str, Any]:
    [rec] = load_records(path)
    return rec


def _per_req(op: str) -> bool:
    return op != "fill"  # fill requests are qemu-img convert's, not one block each


def bound_rows(rec: dict[str, Any], *, fe: int, cores: float, qd: int, engines: list[str]) -> list[dict[str, Any]]:
    """One row per block size and load of one run: the ceiling, the 3x budgets, and what the GPU engines did."""
    rows = {(r["system"], int(r["block"])): r for r in rec["metrics"]["rows"]}
    codec = rec["config"]["codec"]
    out = []
    for block in sorted({b for _, b in rows}):
        base, fwd = rows.get((f"inline-fe{fe}", block)), rows.get((f"forward-fe{fe}", block))
        if base is None or fwd is None:
            continue
        for op in OPS:
            mb, fmb = float(base[f"{op}_mb_s"]), float(fwd[f"{op}_mb_s"])
            target = TARGET * mb
            row: dict[str, Any] = {"record": rec["name"], "sha": rec["git_sha"][:7], "codec": codec, "block": block,
                                   "op": op, "inline_fe_mb_s": mb, "forward_fe_mb_s": fmb, "ceiling_x": fmb / mb,
                                   "reachable": fmb >= target, "target_mb_s": target,
                                   "budget_cpu_s_per_gb": cores / (target / 1e3),
                                   "forward_cpu_s_per_gb": float(fwd[f"{op}_cpu_s_per_gb"])}  # fmt: skip
            if _per_req(op):
                budget = cores / (target * 1e6 / block) * 1e6
                row |= {"budget_us_per_req": budget,
                        "forward_us_per_req": row["forward_cpu_s_per_gb"] * block / 1e3,
                        "budget_qd_latency_us": qd * block / target}  # fmt: skip
                row["engine_budget_us_per_req"] = budget - row["forward_us_per_req"]
            for engine in engines:
                got = rows.get((f"{engine}-fe{fe}", block))
                if got is None:
                    continue
                emb, ecpu = float(got[f"{op}_mb_s"]), float(got[f"{op}_cpu_s_per_gb"])
                row |= {f"{engine}_x": emb / mb, f"{engine}_cpu_s_per_gb": ecpu, f"{engine}_cores": emb * ecpu / 1e3}
                if _per_req(op):
                    row |= {f"{engine}_us_per_req": ecpu * block / 1e3, f"{engine}_qd_latency_us": qd * block / emb}
            out.append(row)
    return out


def nvcomp_rows(recs: list[dict[str, Any]], *, qd: int) -> list[dict[str, Any]]:
    """The nvcomp engine's reads and writes in every record: rate, host cost and round trip per request."""
    out = []
    for rec in recs:
        for r in rec["metrics"]["rows"]:
            system = str(r["system"])
            if not system.startswith("nvcomp"):
                continue
            fe = int(system.rsplit("-fe", 1)[1]) if "-fe" in system else 1
            block = int(r["block"])
            for op in ("read", "write_const"):
                mb, cpu = float(r[f"{op}_mb_s"]), float(r[f"{op}_cpu_s_per_gb"])
                out.append({"record": rec["name"], "sha": rec["git_sha"][:7], "codec": rec["config"]["codec"],
                            "system": system, "frontends": fe, "block": block, "op": op, "mb_s": mb,
                            "req_s": mb * 1e6 / block, "cores": mb * cpu / 1e3, "host_us_per_req": cpu * block / 1e3,
                            "qd_latency_ms": qd * block / mb / 1e3,
                            "jobs_per_batch": float(r.get("engine_jobs_per_batch", 0.0))})  # fmt: skip
    return out


def _figures(rows: list[dict[str, Any]]) -> list[Figure]:
    figs = []
    for r in rows:
        tag = f"{r['codec']}_{r['op']}_{r['block'] // 1024}k"
        src = f"derived from {r['record']} at {r['sha']}: forward-fe over inline-fe, same run and cores"
        figs.append(Figure(name=f"{tag}_ceiling_x", value=r["ceiling_x"], unit="x", basis=Basis.DERIVED,
                           ceiling_source=src))  # fmt: skip
        figs.append(Figure(name=f"{tag}_budget_cpu_s_per_gb", value=r["budget_cpu_s_per_gb"], unit="s/GB",
                           higher_is_better=False, basis=Basis.DERIVED, ceiling_source=src))  # fmt: skip
        if "engine_budget_us_per_req" in r:
            figs.append(Figure(name=f"{tag}_engine_budget_us_per_req", value=r["engine_budget_us_per_req"],
                               unit="us", higher_is_better=False, basis=Basis.DERIVED, ceiling_source=src))  # fmt: skip
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="comma-separated tier records with inline-feN and forward-feN")
    ap.add_argument("--nvcomp", default="", help="comma-separated tier records whose nvcomp rows are compared")
    ap.add_argument("--engines", default="torch,nvcomp")
    ap.add_argument("--frontends", type=int, default=4)
    ap.add_argument("--cores", type=float, default=4.0, help="the cores the servers are pinned to")
    ap.add_argument("--qd", type=int, default=32, help="qemu-img bench's queue depth, shared by its clients")
    ap.add_argument("--name", default="infra_storage_gpu_bound_s12")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/h200/s12"))
    args = ap.parse_args()
    runs = [_load(Path(p)) for p in args.runs.split(",")]
    rows = [r for rec in runs for r in bound_rows(rec, fe=args.frontends, cores=args.cores, qd=args.qd,
                                                  engines=args.engines.split(","))]  # fmt: skip
    nv = nvcomp_rows([_load(Path(p)) for p in args.nvcomp.split(",") if p], qd=args.qd)
    names = ", ".join(f"{rec['name']} at {rec['git_sha'][:7]}" for rec in runs)
    notes = (f"Derived, no new measurement: rows of {names}. "
             f"target = {TARGET:g} x inline-fe{args.frontends} MB/s; budget_cpu_s_per_gb = {args.cores:g} cores / "
             f"target GB/s; budget_us_per_req = that x block; engine_budget = budget - forward-fe{args.frontends}'s "
             f"own us per request; *_qd_latency = {args.qd} x block / MB/s (Little's law). The nvcomp list: the "
             "engine's rows in every record given (one front end: system nvcomp; four: nvcomp-fe4).")  # fmt: skip
    cmd = ["derive_gpu_bound.py", "--runs", args.runs, "--nvcomp", args.nvcomp, "--name", args.name]
    record = make_record(name=args.name, figures=_figures(rows), config=vars(args) | {"out": str(args.out)},
                         metrics={"rows": rows, "nvcomp": nv}, notes=notes, command=cmd)  # fmt: skip
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
