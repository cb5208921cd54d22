"""Issue #8's goals against one session's H200 records (CPU only, no new measurement).

    PYTHONPATH=$PWD/src python benchmarks/gnn/goals_h200.py s11     # -> results/cpu/gnn_goals_h200_s11.json

A session (:data:`SESSIONS`) names its two ``bench_outofcore`` records (papers-like [25,10] @ 8000,
IGB-like [15,10,5] @ 1024), the lane's folder (calibration, profiled workloads, the plans it printed)
and the cache memory its plan step meant. From their numbers only this computes:

* G2 carina at 100% cache against both in-memory runs, whether the goal's condition (IO <= 0.8x
  compute) holds by the run's own prediction and by this tree's model, the measured lane times (the
  IO thread's read stage, the sampler thread, assemble, the step) and, modeled, carina@1 with the host
  hits gathered by the device instead of the CPU;
* G3 every disk-bound carina run against the disk time of the reads it issued (IOs and pages per batch
  from its counters), in both ``disk_cost`` forms and the pre-session-10 additive form;
* G4 carina at the peer budget against cold mmap and synchronous reads, where the record has them;
* G5 the stage checks: as recorded, and this tree's model re-run on the lane's calibration and workload
  (``now``), and again with the two rates the same run measured better than the calibration did
  (``now_in_run_rates``: the host gather rate of the host-gather peer's read stage, and the device's
  gather of pinned rows from the zero-copy peer's checks, fitted through both records' row sizes);
* G6 the model's pick against the best measured configuration, as recorded and re-picked;
* ``carina gnn plan`` for the H200 from the lane's calibration and workloads with this tree's model
  (``plan_<dataset>``, the in-run rates) next to the plan the lane printed (``plan_as_run_<dataset>``);
* one table of the goals, met or not, with the figures above and the measured cause of each miss.

Ratios are ``derived`` (from measured figures); re-predictions are ``modeled``. Session 8's record
(``gnn_goals_h200_s8``) was made by this script's first form, ``goals_h200_s8.py``, at 3aa516b.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from goals_h200_s11 import status_rows_s11
from goals_h200_text import CAUSES, goal_rows, status_rows
from outofcore_record import TOLERANCE, count_within, measured_stage, stage_check

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.calibrate import uva_fit
from carina.gnn.costmodel import (
    MachineSpec,
    Overlap,
    Prediction,
    WorkloadProfile,
    predict,
    predict_in_memory,
    recommend,
)
from carina.gnn.diskcost import PAGE, disk_seconds
from carina.gnn.hostpath import HostGather

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[0] / "results" / "h200"
DATASETS = ("papers", "igb")


@dataclass(frozen=True)
class Session:
    """One device session's lane: where its files are and what it ran."""

    name: str
    lane: str
    records: dict[str, str]
    lane_dir: Path
    machine_file: str
    plan_gb: tuple[float, float] = (5.7, 11.5)  # GPU, host memory for the cache in the lane's plan step
    run: dict[str, Any] = field(default_factory=dict)

    def workload(self, ds: str) -> WorkloadProfile:
        """The workload the bench profiled (full hotness curve; the record keeps every 10th point)."""
        return WorkloadProfile.load(self.lane_dir / f"workload_{self.records[ds]}.json")

    def machine(self) -> MachineSpec:
        """The lane's calibration, as recorded."""
        return MachineSpec.load(self.lane_dir / self.machine_file)


def _session(name: str, suffix: str, machine_file: str, lane: str) -> Session:
    lane_dir = HERE / "h200" / name
    run = json.loads((lane_dir / "run.json").read_text()) if (lane_dir / "run.json").is_file() else {}
    records = {"papers": f"gnn_outofcore_papers_25x10_h200{suffix}", "igb": f"gnn_outofcore_igb_15x10x5_h200{suffix}"}
    return Session(name=name, lane=lane, records=records, lane_dir=lane_dir, machine_file=machine_file, run=run)


SESSIONS = {
    "s8": _session("s8", "", "machine_h200.json", "benchmarks/gnn/lane_h200_s8.sh at 608d077"),
    "s9": _session("s9", "_s9", "machine_h200_s9.json", "benchmarks/gnn/lane_h200_s9.sh at a365d0c"),
    "s11": _session("s11", "_s11", "machine_h200_s11.json", "benchmarks/gnn/lane_h200.sh (s11 form) at acec381"),
}


def load(name: str) -> dict[str, Any]:
    """A committed H200 record by name."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def carina_runs(rec: dict) -> dict[str, dict]:
    """Every carina run of a record: ``carina@<budget>`` and ``carina <alternative>``."""
    m = rec["metrics"]
    return {f"carina@{b}": r for b, r in m["carina"].items()} | {f"carina {k}": r for k, r in m["ablations"].items()}


def per_batch(run: dict, stage: str, minus: str | None = None) -> float:
    """A stage's seconds per call, as the stage checks measure it (0 if it never ran).

    :func:`outofcore_record.measured_stage`: the warm-up calls left out where the record has each
    call's time, else the stage's total over its count (the s8 and s9 records).
    """
    return measured_stage(run, (stage,), minus) or 0.0


def in_run_rates(recs: dict[str, dict]) -> dict[str, Any]:
    """Rates the records' own peers measured (derived): the CPU gather of the host-gather peer's read
    stage per dataset, and the device's gather of pinned rows from the zero-copy peer's checks
    (check time per batch over in-memory's, a lower bound of the gather's time), fitted through both
    row sizes (:func:`carina.gnn.calibrate.uva_fit`)."""
    gather, uva_rows = {}, {}
    for ds, rec in recs.items():
        m, sys_ = rec["metrics"], rec["metrics"]["systems"]
        rows, row = m["workload"]["unique_per_batch"], m["workload"]["row_bytes"]
        if "host-gather" in sys_:
            gather[ds] = rows * row / per_batch(sys_["host-gather"], "read") / 1e9
        if "zero-copy" in sys_:
            zc, mem = sys_["zero-copy"], sys_["in-memory"]
            check = zc["check_s"] / zc["stage_n"]["assemble"] - mem["check_s"] / mem["stage_n"]["assemble"]
            uva_rows[row] = check / rows
    out: dict[str, Any] = {"host_gather_gbps": gather, "uva_s_per_row": {str(k): v for k, v in uva_rows.items()}}
    if {512, 4096} <= set(uva_rows):
        rate, per_row = uva_fit(uva_rows[512], uva_rows[4096])
        out |= {"uva_gbps": rate / 1e9, "uva_row_ns": per_row * 1e9}
    return out


def machine_with(machine: MachineSpec, rates: dict[str, Any], ds: str) -> MachineSpec:
    """The calibration with the in-run rates (those measured) in place of its own."""
    over = {k: rates[k] for k in ("uva_gbps", "uva_row_ns") if k in rates}
    if ds in rates["host_gather_gbps"]:
        over["host_gather_gbps"] = rates["host_gather_gbps"][ds]
    return MachineSpec.from_dict(machine.to_dict() | over)


def repredict(rec: dict, machine: MachineSpec, work: WorkloadProfile) -> dict[str, dict[str, Any]]:
    """This tree's model on every carina run of ``rec``, checked stage by stage against its measured times."""
    bs, out = rec["config"]["batch_size"], {}
    for key, run in carina_runs(rec).items():
        p = predict_run(machine, work, run)
        pred = {"stages": p.stages, "batch_s": p.batch_s, "seeds_per_s": p.seeds_per_s, "lanes": p.lanes}
        out[key] = {"prediction": pred, "check": stage_check(run | {"predicted": pred, "batch_size": bs})}
    return out


def predict_run(machine: MachineSpec, work: WorkloadProfile, run: dict, **over: Any) -> Prediction:
    """The model's prediction for one recorded carina run (its cache sizes, gap, pipelining, host path)."""
    c, rb = run.get("cache_bytes", {}), work.row_bytes
    kw: dict[str, Any] = {
        "gpu_cache_rows": c.get("gpu", 0) // rb,
        "host_cache_rows": c.get("host", 0) // rb,
        "overlap": Overlap.PIPELINED if run.get("pipeline_depth", 3) > 1 else Overlap.SERIAL,
        "gap_pages": run["gap_pages"],
        "host_gather": HostGather(run.get("host_gather", "cpu")),
    }
    return predict(machine, work, **(kw | over))


def summary(checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pairs within 15% (all, own-timer) and predicted/measured by stage."""
    by_stage: dict[str, list[float]] = {}
    for c in checks.values():
        for stage, v in c.items():
            by_stage.setdefault(stage, []).append(v["predicted_over_measured"])
    return count_within(checks) | {"ratios": by_stage}


def recorded_checks(rec: dict) -> dict[str, dict[str, Any]]:
    """The record's own stage checks (its predictions), recomputed with each pair's timer kind."""
    bs = rec["config"]["batch_size"]
    return {k: stage_check(r | {"batch_size": bs}) for k, r in carina_runs(rec).items()}


def lanes_of(stages: dict[str, float]) -> dict[str, float]:
    """The IO thread's and the device's seconds per batch from predicted stages (sampler on the device)."""
    io = stages.get("disk", 0.0) + stages.get("gather", 0.0)
    sampler = stages["sample"] + stages.get("lookup", 0.0)
    device = sampler + stages["transfer"] + stages.get("device_gather", 0.0) + stages["compute"]
    return {"io": io, "device": device, "io_over_device": io / device}


def measured_lanes(run: dict, batch_size: int) -> dict[str, float]:
    """Milliseconds per batch of each thread's timed work, and the batch (from the rate)."""
    return {
        "read_ms": per_batch(run, "read") * 1e3,
        "sample_plan_ms": (per_batch(run, "sample") + per_batch(run, "plan")) * 1e3,
        "sample_ms": per_batch(run, "sample") * 1e3,
        "plan_ms": per_batch(run, "plan") * 1e3,
        "assemble_ms": per_batch(run, "assemble", minus="check") * 1e3,
        "train_ms": per_batch(run, "train") * 1e3,
        "batch_ms": batch_size / run["seeds_per_s"] * 1e3,
    }


def g2(ds: str, rec: dict, work: WorkloadProfile, now: MachineSpec) -> tuple[list[Figure], dict[str, Any]]:
    """carina@1 against in-memory; the goal's condition; measured lanes; the device path, modeled."""
    m, bs = rec["metrics"], rec["config"]["batch_size"]
    full = m["carina"].get("1")
    if full is None:
        return [], {}
    mems = {k: m["systems"][k]["seeds_per_s"] for k in ("in-memory", "in-memory again") if k in m["systems"]}
    ratios = {k: full["seeds_per_s"] / v for k, v in mems.items()}
    path = full.get("host_gather", "cpu")  # the host path carina@1 ran (the s8/s9 records: cpu, unnamed)
    cpu = predict_run(now, work, full, host_gather=HostGather.CPU)
    as_run = predict_run(now, work, full)
    mem = predict_in_memory(now, work)
    out: dict[str, Any] = {
        "carina@1": full["seeds_per_s"],
        "host_path": path,
        "in_memory": mems,
        "ratios": ratios,
        "condition_recorded": lanes_of(full["predicted"]["stages"]),
        "condition_now": lanes_of(as_run.stages),
        "measured_lanes": {
            "carina@1": measured_lanes(full, bs),
            "in-memory": measured_lanes(m["systems"]["in-memory"], bs),
        },
        "predicted_now": {"carina@1 cpu path": cpu.seeds_per_s, "in-memory": mem.seeds_per_s},
    }
    other = next((r for k, r in m["ablations"].items() if k.startswith("host-gather ") and k.endswith("@1")), None)
    if other is not None:  # the other host path at 100% (s11 on): measured next to the pick
        out["other_path"] = {
            "host_path": other["host_gather"],
            "seeds_per_s": other["seeds_per_s"],
            "ratios": {k: other["seeds_per_s"] / v for k, v in mems.items()},
            "measured_lanes": measured_lanes(other, bs),
        }
    figs = [
        Figure(
            name=f"{ds}.G2.carina@1_over_in_memory",
            value=min(ratios.values()),
            unit="x",
            basis=Basis.DERIVED,
            ceiling=1.0,
            ceiling_source="the faster in-memory run of the same record",
            peers={"goal": 0.9} | {f"over {k}": v for k, v in ratios.items()},
        )
    ]
    if other is not None:
        o = out["other_path"]
        figs.append(
            Figure(
                name=f"{ds}.G2.carina_{o['host_path']}_path@1_over_in_memory",
                value=min(o["ratios"].values()),
                unit="x",
                basis=Basis.DERIVED,
                ceiling=1.0,
                ceiling_source="the faster in-memory run of the same record",
                peers={"goal": 0.9} | {f"over {k}": v for k, v in o["ratios"].items()},
            )
        )
    if now.device_gather_priced:
        dev = predict_run(now, work, full, host_gather=HostGather.DEVICE)
        out["predicted_now"]["carina@1 device path"] = dev.seeds_per_s
        out["condition_device_path"] = lanes_of(dev.stages)
        figs.append(
            Figure(
                name=f"{ds}.G2.device_path_predicted_over_in_memory_predicted",
                value=dev.seeds_per_s / mem.seeds_per_s,
                unit="x",
                basis=Basis.MODELED,
                peers={
                    f"cpu path{' (as run)' if path == 'cpu' else ''}, predicted": cpu.seeds_per_s / mem.seeds_per_s,
                    "goal": 0.9,
                },
            )
        )
    return figs, out


def disk_forms(machine: MachineSpec, ios: float, pages: float) -> dict[str, float]:
    """Disk seconds of ``ios`` reads of ``pages`` pages in both forms, and the additive form before session 10."""
    forms = {
        f: disk_seconds(MachineSpec.from_dict(machine.to_dict() | {"disk_cost": f}), ios, pages)
        for f in ("additive", "overlapped")
    }
    forms["additive_before_s10"] = ios / machine.ssd_iops + pages * PAGE / (machine.ssd_read_gbps * 1e9)
    return forms


def g3(ds: str, rec: dict, machine: MachineSpec) -> tuple[list[Figure], dict[str, Any]]:
    """Measured batch time of each disk-bound run against the disk time of the reads it issued."""
    figs, rows, bs = [], {}, rec["config"]["batch_size"]
    for key, run in carina_runs(rec).items():
        n = run.get("stage_n", {}).get("read", 0)
        if not n or not run["fetch"]["ios"] or run["fetch"]["misses"] < run["fetch"]["rows"] * 1e-3:
            continue
        ios, pages = run["fetch"]["ios"] / n, run["fetch"]["pages"] / n
        batch = bs / run["seeds_per_s"]
        forms = disk_forms(machine, ios, pages)
        rows[key] = {"ios": ios, "pages": pages, "batch_s": batch, "read_s": per_batch(run, "read"), **forms}
        figs.append(
            Figure(
                name=f"{ds}.G3.{key}_over_disk_bound",
                value=forms[machine.disk_cost] / batch,
                unit="x",
                basis=Basis.DERIVED,
                peers={f"{f} form": v / batch for f, v in forms.items() if f != machine.disk_cost},
            )
        )
    return figs, rows


def g4(ds: str, rec: dict) -> list[Figure]:
    """carina at the peer budget against cold mmap and synchronous reads (where the record has them)."""
    m = rec["metrics"]
    pb = f"{m['peer_budget']:g}"
    run, systems = m["carina"].get(pb), m["systems"]
    return [
        Figure(
            name=f"{ds}.G4.carina@{pb}_over_{peer}",
            value=run["seeds_per_s"] / systems[peer]["seeds_per_s"],
            unit="x",
            basis=Basis.DERIVED,
            peers={"goal": goal},
        )
        for peer, goal in (("mmap", 3.0), ("sync-reads", 1.5))
        if run is not None and peer in systems
    ]


def g5(ds: str, rec: dict, variants: dict[str, MachineSpec], work: WorkloadProfile) -> tuple[list[Figure], dict]:
    """Stage checks: as recorded, and this tree's model under each machine variant (re-predicted)."""
    out = {"recorded": summary(recorded_checks(rec))}
    predictions = {}
    for name, machine in variants.items():
        runs = repredict(rec, machine, work)
        out[name] = summary({k: v["check"] for k, v in runs.items()})
        predictions[name] = {k: v["prediction"] for k, v in runs.items()}
    figs = [
        Figure(
            name=f"{ds}.G5.stage_predictions_within_15pct.{name}",
            value=v["within"] / v["pairs"],
            unit="share",
            basis=Basis.DERIVED if name == "recorded" else Basis.MODELED,
            peers={} if name == "recorded" else {"as recorded": out["recorded"]["within"] / out["recorded"]["pairs"]},
        )
        for name, v in out.items()
        if v["pairs"]
    ]
    return figs, out | {"predictions": predictions}


def g6(ds: str, rec: dict, machine: MachineSpec, work: WorkloadProfile) -> tuple[list[Figure], dict[str, Any]]:
    """The model's pick at the peer budget against the best measured: as recorded, and re-picked."""
    recorded = rec["metrics"].get("recommended")
    if not recorded:
        return [], {}
    runs = carina_runs(rec)
    predicted = {k: predict_run(machine, work, runs[k]).seeds_per_s for k in recorded["measured"]}
    measured = recorded["measured"]
    pick = max(predicted, key=lambda k: predicted[k])
    now = {"picked": pick, "ratio": measured[pick] / max(measured.values()), "predicted": predicted}
    figs = [
        Figure(
            name=f"{ds}.G6.recommended_over_best",
            value=recorded["ratio"],
            unit="x",
            basis=Basis.DERIVED,
            peers={"goal": 0.9, "re-picked by this tree's model": now["ratio"]},
        )
    ]
    return figs, {"recorded": recorded, "now": now}


def plan_row(p: Prediction | dict) -> dict[str, Any]:
    """One row of ``carina gnn plan``'s table, from a prediction or the JSON the command printed."""
    d = p if isinstance(p, dict) else vars(p)
    st = d["stages"]
    keys = ("sample", "lookup", "disk", "gather", "transfer", "device_gather", "compute")
    return {
        "ssds": int(d["config"]["ssd_count"]),
        "host_gather": d.get("host_gather", "cpu"),
        "gpu_cache_rows": int(d["config"]["gpu_cache_rows"]),
        "host_cache_rows": int(d["config"]["host_cache_rows"]),
        **{f"{k}_ms": round(st[k] * 1e3, 2) for k in keys if k in st},
        "bottleneck": d["bottleneck"],
        "seeds_per_s": round(d["seeds_per_s"]),
        "tpc_x1e3": round(d["tpc"] * 1e3, 3),
    }


def plans(sess: Session, ds: str, machine: MachineSpec) -> tuple[list[dict], list[dict]]:
    """This tree's plan on ``machine`` with the lane's cache memory and no reserves, and the plan the lane printed."""
    gpu, host = sess.plan_gb
    m = MachineSpec.from_dict(machine.to_dict() | {"gpu_mem_gb": gpu, "host_mem_gb": host})
    _, cands = recommend(m, sess.workload(ds), max_ssds=6, gpu_reserve_gb=0.0, host_reserve_gb=0.0)
    path = sess.lane_dir / f"plan_{sess.records[ds]}.json"
    as_run = json.loads(path.read_text())["candidates"] if path.is_file() else []
    return [plan_row(c) for c in cands], [plan_row(c) for c in as_run]


def dataset_goals(sess: Session, ds: str, recs: dict[str, dict], rates: dict) -> tuple[list[Figure], dict, dict]:
    """Every goal's figures and metrics for one dataset of the session, and its plans."""
    rec, work = recs[ds], sess.workload(ds)
    recorded_machine = sess.machine()
    now = machine_with(recorded_machine, rates, ds)
    variants = {"now": recorded_machine, "now_in_run_rates": now}
    f2, m2 = g2(ds, rec, work, now)
    f3, m3 = g3(ds, rec, recorded_machine)
    f5, m5 = g5(ds, rec, variants, work)
    f6, m6 = g6(ds, rec, now, work)
    mem = predict_in_memory(now, work)
    measured_mem = {k: v["seeds_per_s"] for k, v in rec["metrics"]["systems"].items() if k.startswith("in-memory")}
    bs, systems = rec["config"]["batch_size"], rec["metrics"]["systems"]
    runs = {k: v for k, v in systems.items() if k.startswith("in-memory")} | carina_runs(rec)
    metrics = {
        "record": sess.records[ds],
        "g2": m2,
        "disk_bound": m3,
        "stage_checks": m5,
        "recommended": m6,
        "in_memory_model": {"predicted": mem.seeds_per_s, "measured": measured_mem},
        "lanes": {k: measured_lanes(v, bs) for k, v in runs.items()},  # each thread's ms a batch, every run
        "skipped": rec["metrics"]["skipped"],
    }
    plan, as_run = plans(sess, ds, now)
    return [*f2, *f3, *g4(ds, rec), *f5, *f6], metrics, {f"plan_{ds}": plan, f"plan_as_run_{ds}": as_run}


def main(argv: list[str]) -> None:
    sess = SESSIONS[argv[0] if argv else "s9"]
    recs = {ds: load(sess.records[ds]) for ds in DATASETS}
    rates = in_run_rates(recs)
    figures: list[Figure] = []
    metrics: dict[str, Any] = {"in_run_rates": rates, "lane": sess.lane, "run": sess.run}
    for ds in DATASETS:
        figs, m, plan = dataset_goals(sess, ds, recs, rates)
        figures += figs
        metrics[ds] = m
        metrics |= plan
    calibration = sess.machine()
    metrics["goals"] = goal_rows(metrics, CAUSES[sess.name], calibration.disk_cost, calibration.ssd_iops, sess.name)
    cpu_dir = RESULTS.parent / "cpu"
    earlier = {
        name: {f["name"]: f["value"] for f in json.loads((cpu_dir / f"{name}.json").read_text())["figures"]}
        for name in ("gnn_goals_h200_s8", "gnn_goals_h200_s9")
        if name != f"gnn_goals_h200_{sess.name}"
    }
    if sess.name == "s9":  # the status across both sessions: session 8's goals record has G4
        metrics["status"] = status_rows(metrics, earlier["gnn_goals_h200_s8"], f"gnn_goals_h200_{sess.name}")
    elif sess.name == "s11":  # G4 from s8, IGB-like at 50% from s9 (not run in s11)
        metrics["status"] = status_rows_s11(metrics, earlier, f"gnn_goals_h200_{sess.name}")
    rec = make_record(
        name=f"gnn_goals_h200_{sess.name}",
        figures=figures,
        config={"session": sess.name, "records": sorted(sess.records.values()), "tolerance": TOLERANCE},
        metrics=metrics,
        notes=f"Computed on the CPU from the committed H200 records of {sess.lane}; no new measurement. "
        "Ratios of measured figures are derived; re-predictions (this tree's cost model on the lane's "
        "calibration and profiled workloads, and with the rates the same runs measured) are modeled.",
    )
    print(write_record(rec))
    for f in figures:
        print(f"{f.name:64s} {f.value:12.4g} {f.unit:8s} {f.peers}")


if __name__ == "__main__":
    main(sys.argv[1:])
