"""The cost model's cache-lookup term (session 13) on session 11's H200 records, fitted to the same runs.

    PYTHONPATH=$PWD/src python benchmarks/gnn/lookup_refit.py s11   # -> results/cpu/gnn_lookup_refit_h200_s11.json

The session-11 calibration has no lookup rates (``carina gnn calibrate`` measures them from session 13
on), so they are fitted here to the records' own plan stage at 100% cache, where (almost) nothing misses
and the plan stage is the lookup alone (the lookup code of that lane, before session 13 cut its host
reads). Per dataset, the device path's plan time a batch (runs with under one miss in a million rows) is
the fixed part ``lookup_batch_us``; the per-id part is left at 0 (the two datasets' batches differ by 7%
in ids, too little to split a line through them); the cpu path's plan time above it, per host hit, is
``lookup_host_id_ns``. With those rates and the in-run rates (``goals_h200.py``'s ``now_in_run_rates``)
this re-predicts every carina run: the stage checks, carina@1 on both host paths against in-memory, and
the pick between the paths.

The figures are in-sample: the rates come from the runs they are checked against (``modeled``, the
fitted rates ``derived``). A device run of the session-13 lane, whose calibration measures the rates, is
the test.
"""

from __future__ import annotations

import sys
from typing import Any

from goals_h200 import SESSIONS, carina_runs, in_run_rates, load, machine_with, per_batch, predict_run, repredict
from goals_h200 import summary as check_summary

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.costmodel import MachineSpec, WorkloadProfile, predict_in_memory
from carina.gnn.hostpath import HostGather

DATASETS = ("papers", "igb")


def fitted_rates(rec: dict) -> dict[str, Any]:
    """Lookup rates from the carina@1 runs (no misses): the device path's plan stage, the cpu path's excess."""
    full = {k: r for k, r in carina_runs(rec).items() if r["fetch"]["misses"] < r["fetch"]["rows"] * 1e-6}
    dev = [per_batch(r, "plan") for r in full.values() if r["host_gather"] == "device"]
    cpu = [(per_batch(r, "plan"), r["fetch"]["host_hits"] / r["stage_n"]["plan"]) for r in full.values()]
    cpu = [c for c, r in zip(cpu, full.values(), strict=True) if r["host_gather"] == "cpu"]
    batch_s = sum(dev) / len(dev)
    excess = [max(0.0, t - batch_s) / hits for t, hits in cpu]
    return {
        "runs": sorted(full),
        "device_path_plan_ms": [t * 1e3 for t in dev],
        "cpu_path_plan_ms": [t * 1e3 for t, _ in cpu],
        "lookup_batch_us": batch_s * 1e6,
        "lookup_id_ns": 0.0,
        "lookup_host_id_ns": sum(excess) / len(excess) * 1e9,
    }


def at_full_cache(rec: dict, machine: MachineSpec, work: WorkloadProfile) -> dict[str, Any]:
    """carina@1 on both host paths, predicted, against in-memory (predicted) and as measured."""
    runs = carina_runs(rec)
    full = runs["carina@1"]
    other = next(r for k, r in runs.items() if k.startswith("host-gather ") or k.startswith("carina host-gather"))
    measured = {full["host_gather"]: full["seeds_per_s"], other["host_gather"]: other["seeds_per_s"]}
    pred = {h.value: predict_run(machine, work, full, host_gather=h) for h in (HostGather.CPU, HostGather.DEVICE)}
    mem = predict_in_memory(machine, work).seeds_per_s
    in_memory = rec["metrics"]["systems"]["in-memory"]["seeds_per_s"]
    return {
        "measured_over_in_memory": {k: v / in_memory for k, v in measured.items()},
        "predicted": {k: p.seeds_per_s for k, p in pred.items()},
        "predicted_sampler_ms": {k: (p.stages["sample"] + p.stages["lookup"]) * 1e3 for k, p in pred.items()},
        "predicted_in_memory": mem,
        "measured": measured,
        "measured_sampler_ms": {
            r["host_gather"]: (per_batch(r, "sample") + per_batch(r, "plan")) * 1e3 for r in (full, other)
        },
        "pick": max(pred, key=lambda k: pred[k].seeds_per_s),
        "faster_measured": max(measured, key=lambda k: measured[k]),
    }


def dataset(sess: Any, ds: str, rec: dict, rates: dict) -> tuple[list[Figure], dict[str, Any]]:
    """The fitted rates, the re-predicted stage checks and carina@1's host paths for one dataset."""
    work = sess.workload(ds)
    base = machine_with(sess.machine(), rates, ds)
    fit = fitted_rates(rec)
    fitted = MachineSpec.from_dict(base.to_dict() | {k: fit[k] for k in fit if k.startswith("lookup_")})
    checks = {
        name: check_summary({k: v["check"] for k, v in repredict(rec, m, work).items()})
        for name, m in (("without_lookup", base), ("fitted_lookup", fitted))
    }
    full = {name: at_full_cache(rec, m, work) for name, m in (("without_lookup", base), ("fitted_lookup", fitted))}
    f, w = full["fitted_lookup"], full["without_lookup"]
    meas = f["measured"]
    figs = [
        Figure(name=f"{ds}.lookup_fit.batch_us", value=fit["lookup_batch_us"], unit="us", basis=Basis.DERIVED),
        Figure(name=f"{ds}.lookup_fit.host_id_ns", value=fit["lookup_host_id_ns"], unit="ns", basis=Basis.DERIVED),
        Figure(
            name=f"{ds}.G5.stage_predictions_within_15pct.fitted_lookup",
            value=checks["fitted_lookup"]["within"] / checks["fitted_lookup"]["pairs"],
            unit="share",
            basis=Basis.MODELED,
            peers={"without the lookup term": checks["without_lookup"]["within"] / checks["without_lookup"]["pairs"]},
        ),
        Figure(
            name=f"{ds}.carina@1.cpu_over_device_path.predicted",
            value=f["predicted"]["cpu"] / f["predicted"]["device"],
            unit="x",
            basis=Basis.MODELED,
            peers={
                "measured": meas["cpu"] / meas["device"],
                "without the lookup term": w["predicted"]["cpu"] / w["predicted"]["device"],
            },
        ),
    ]
    for path in ("device", "cpu"):
        figs.append(
            Figure(
                name=f"{ds}.carina@1.{path}_path_over_in_memory.predicted",
                value=f["predicted"][path] / f["predicted_in_memory"],
                unit="x",
                basis=Basis.MODELED,
                peers={
                    "measured (over in-memory, run first)": f["measured_over_in_memory"][path],
                    "without the lookup term": w["predicted"][path] / w["predicted_in_memory"],
                },
            )
        )
        figs.append(
            Figure(
                name=f"{ds}.carina@1.{path}_path.sampler_ms.predicted_over_measured",
                value=f["predicted_sampler_ms"][path] / f["measured_sampler_ms"][path],
                unit="x",
                basis=Basis.MODELED,
                peers={"without the lookup term": w["predicted_sampler_ms"][path] / w["measured_sampler_ms"][path]},
            )
        )
    return figs, {"fit": fit, "stage_checks": checks, "carina@1": full}


def main(argv: list[str]) -> None:
    sess = SESSIONS[argv[0] if argv else "s11"]
    recs = {ds: load(sess.records[ds]) for ds in DATASETS}
    rates = in_run_rates(recs)
    figures: list[Figure] = []
    metrics: dict[str, Any] = {"lane": sess.lane, "in_run_rates": rates}
    for ds in DATASETS:
        figs, m = dataset(sess, ds, recs[ds], rates)
        figures += figs
        metrics[ds] = m
    rec = make_record(
        name=f"gnn_lookup_refit_h200_{sess.name}",
        figures=figures,
        config={"session": sess.name, "records": sorted(sess.records.values())},
        metrics=metrics,
        notes="Computed on the CPU from the committed H200 records; no new measurement. The lookup rates are "
        "fitted to the carina@1 runs' plan stage of the same records (derived), and the re-predictions with "
        "them are in-sample (modeled): a device run that calibrates the rates is the test.",
    )
    print(write_record(rec))
    for fig in figures:
        print(f"{fig.name:64s} {fig.value:12.4g} {fig.unit:6s} {fig.peers}")


if __name__ == "__main__":
    main(sys.argv[1:])
