"""Issue #8's goals against the session-8 H200 records (CPU only, no new measurement).

Reads ``benchmarks/results/h200/gnn_outofcore_{papers_25x10,igb_15x10x5}_h200.json`` (``lane_h200_s8.sh`` at
608d077) and computes, from their numbers only:

* G2 carina at 100% cache against in-memory (the model predicts no disk there);
* G3 every disk-bound carina run against its disk bound: the batch time the calibrated disk needs for the
  reads the run issued (IOs and pages per batch from its counters), in both ``disk_cost`` forms;
* G4 carina at the peer budget against cold mmap and synchronous reads at that budget;
* G5 the record's stage check, grouped by stage, and the cost model of this tree re-run on the records'
  machine and workload (lanes: IO thread = disk + host gather, device = sample + transfer + compute);
  its in-memory prediction is checked against the measured in-memory run (the recorded model had
  ``max(sample, compute)`` there);
* the recommended-configuration goal, which these records cannot answer (no alternative at the peer
  budget ran);
* ``carina gnn plan`` for the H200 from the lane's calibration and profiled workloads
  (``benchmarks/gnn/h200/s8/``) with this tree's model, the cache memory the lane meant (5.7 GB GPU,
  11.5 GB host, the peer budget's split) and no reserves (``plan_<dataset>``), next to the plan as the
  lane ran it (``plan_as_run_<dataset>``: the old model, and the 8/16 GB reserves took all of that memory);
* one table of the goals, met or not, with the figures above (``goals``).

Ratios are ``derived`` (from measured figures); re-predictions are ``modeled``::

    PYTHONPATH=$PWD/src python benchmarks/gnn/goals_h200_s8.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.costmodel import MachineSpec, Overlap, Prediction, WorkloadProfile, disk_seconds, predict, recommend

RESULTS = Path(__file__).resolve().parents[1] / "results" / "h200"
LANE = Path(__file__).resolve().parent / "h200" / "s8"
PLAN_GB = (5.7, 11.5)  # GPU, host memory for the cache in the lane's plan step
RECORDS = {"papers": "gnn_outofcore_papers_25x10_h200", "igb": "gnn_outofcore_igb_15x10x5_h200"}
TOL = 0.15


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _batch_s(rec: dict, seeds_per_s: float) -> float:
    return rec["config"]["batch_size"] / seeds_per_s


def _g2(ds: str, rec: dict) -> list[Figure]:
    m = rec["metrics"]
    full = m["carina"].get("1")
    if full is None:
        return []
    mem = m["systems"]["in-memory"]["seeds_per_s"]
    return [
        Figure(
            name=f"{ds}.G2.carina@1_over_in_memory",
            value=full["seeds_per_s"] / mem,
            unit="x",
            basis=Basis.DERIVED,
            ceiling=1.0,
            ceiling_source="in-memory run of the same record",
            peers={"goal": 0.9},
        )
    ]


def _g3(ds: str, rec: dict, machine: MachineSpec) -> tuple[list[Figure], dict]:
    """Measured batch time of each disk-bound run against the disk time of the reads it issued."""
    figs, rows = [], {}
    for b, run in rec["metrics"]["carina"].items():
        n = run.get("stage_n", {}).get("read", 0)
        if not n or run["predicted"]["bottleneck"] != "disk" or not run["fetch"]["ios"]:
            continue
        ios, pages = run["fetch"]["ios"] / n, run["fetch"]["pages"] / n
        batch = _batch_s(rec, run["seeds_per_s"])
        forms = {
            f: disk_seconds(MachineSpec.from_dict(machine.to_dict() | {"disk_cost": f}), ios, pages)
            for f in ("additive", "overlapped")
        }
        read = run["stage_s"]["read"] / n
        rows[f"carina@{b}"] = {"ios": ios, "pages": pages, "batch_s": batch, "read_s": read, **forms}
        figs.append(
            Figure(
                name=f"{ds}.G3.carina@{b}_over_disk_bound",
                value=forms["overlapped"] / batch,
                unit="x",
                basis=Basis.DERIVED,
                peers={
                    "additive form": forms["additive"] / batch,
                    "read stage / overlapped": read / forms["overlapped"],
                },
            )
        )
    return figs, rows


def _g4(ds: str, rec: dict) -> list[Figure]:
    m = rec["metrics"]
    pb = f"{m['peer_budget']:g}"
    run, systems = m["carina"].get(pb), m["systems"]
    figs = []
    for peer, goal in (("mmap", 3.0), ("sync-reads", 1.5)):
        if run is None or peer not in systems:
            continue
        figs.append(
            Figure(
                name=f"{ds}.G4.carina@{pb}_over_{peer}",
                value=run["seeds_per_s"] / systems[peer]["seeds_per_s"],
                unit="x",
                basis=Basis.DERIVED,
                peers={"goal": goal},
            )
        )
    return figs


def _g5_stages(rec: dict) -> dict[str, list[float]]:
    """predicted / measured per stage, over the record's carina runs."""
    out: dict[str, list[float]] = {}
    for checks in rec["metrics"]["stage_check"]["runs"].values():
        for stage, v in checks.items():
            out.setdefault(stage, []).append(v["predicted_over_measured"])
    return out


def _g5_model(ds: str, rec: dict, machine: MachineSpec) -> tuple[list[Figure], dict]:
    """This tree's model on the record's machine and workload: in memory, and each carina budget."""
    m = rec["metrics"]
    work = WorkloadProfile.from_dict(m["workload"])
    n = work.num_nodes
    mem = predict(machine, work, gpu_cache_rows=n, host_cache_rows=0)
    measured_mem = m["systems"]["in-memory"]["seeds_per_s"]
    old_mem = work.batch_size / max(work.sample_s, work.compute_s)  # the recorded model's lanes
    figs = [
        Figure(
            name=f"{ds}.G5.in_memory_predicted_seeds_per_s",
            value=mem.seeds_per_s,
            unit="seeds/s",
            basis=Basis.MODELED,
            peers={"measured": measured_mem, "model before session 8 (max of lanes)": old_mem},
        )
    ]
    rows = {"in-memory": {"predicted": mem.seeds_per_s, "old_model": old_mem, "measured": measured_mem}}
    for b, run in m["carina"].items():
        c = run.get("cache_bytes", {})
        rb = work.row_bytes
        p = predict(
            machine,
            work,
            gpu_cache_rows=c.get("gpu", 0) // rb,
            host_cache_rows=c.get("host", 0) // rb,
            overlap=Overlap.PIPELINED,
            gap_pages=run["gap_pages"],
        )
        rows[f"carina@{b}"] = {
            "predicted": p.seeds_per_s,
            "recorded_prediction": run["predicted"]["seeds_per_s"],
            "measured": run["seeds_per_s"],
            "bottleneck": p.bottleneck,
            "stages": p.stages,
        }
    return figs, rows


def _plan_row(p: Prediction | dict) -> dict[str, Any]:
    d = p if isinstance(p, dict) else {"config": p.config, "stages": p.stages} | vars(p)
    st = d["stages"]
    return {
        "ssds": int(d["config"]["ssd_count"]),
        "gpu_cache_rows": int(d["config"]["gpu_cache_rows"]),
        "host_cache_rows": int(d["config"]["host_cache_rows"]),
        **{f"{k}_ms": round(st[k] * 1e3, 2) for k in ("sample", "disk", "gather", "transfer", "compute") if k in st},
        "bottleneck": d["bottleneck"],
        "seeds_per_s": round(d["seeds_per_s"]),
        "tpc_x1e3": round(d["tpc"] * 1e3, 3),
    }


def _plans(name: str) -> tuple[list[dict], list[dict]]:
    """This tree's plan from the lane's calibration and workload, and the plan as the lane printed it."""
    machine = MachineSpec.load(LANE / "machine_h200.json")
    machine = MachineSpec.from_dict(machine.to_dict() | {"gpu_mem_gb": PLAN_GB[0], "host_mem_gb": PLAN_GB[1]})
    work = WorkloadProfile.load(LANE / f"workload_{name}.json")
    _, cands = recommend(machine, work, max_ssds=6, gpu_reserve_gb=0.0, host_reserve_gb=0.0)
    as_run = json.loads((LANE / f"plan_{name}.json").read_text())["candidates"]
    return [_plan_row(c) for c in cands], [_plan_row(c) for c in as_run]


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "not met")


def _goals(metrics: dict[str, Any], figures: list[Figure]) -> list[dict[str, str]]:
    """One row per goal and dataset: what was measured against the target, and the cause where it was missed."""
    f = {x.name: x for x in figures}
    rows = []
    g2 = f.get("papers.G2.carina@1_over_in_memory")
    if g2:
        rows.append(
            {
                "goal": ">= 0.9x in-memory where IO <= 0.8x compute",
                "dataset": "papers-like",
                "measured": f"carina@1 {g2.value:.2f}x in-memory",
                "verdict": _verdict(g2.value >= 0.9),
                "cause": "the training thread gathered the host-cache hits on the CPU and copied them "
                "pageable (assemble per batch: see stage_check transfer); fixed (gather on the IO thread, pinned "
                "staging), not re-measured; this tree's model predicts "
                f"{metrics['papers']['model_now']['carina@1']['predicted']:.0f} seeds/s there",
            }
        )
    for ds, label in (("papers", "papers-like"), ("igb", "IGB-like")):
        g3 = sorted((x for x in figures if x.name.startswith(f"{ds}.G3.")), key=lambda x: x.name)
        if g3:
            within = [x for x in g3 if abs(x.value - 1) <= TOL]
            rows.append(
                {
                    "goal": "within 15% of the disk bound where IO-bound",
                    "dataset": label,
                    "measured": ", ".join(f"{x.name.split('.G3.')[1].split('_over')[0]} {x.value:.2f}x" for x in g3),
                    "verdict": f"{len(within)} of {len(g3)} runs",
                    "cause": "measured throughput over what the calibrated disk allows for the reads each "
                    "run issued (overlapped form); above 1: faster than the calibration (taken at queue depth 64; "
                    "the bench reads at 128), below 1: time outside the disk reads",
                }
            )
        for peer, goal in (("mmap", 3.0), ("sync-reads", 1.5)):
            g4 = next((x for x in figures if x.name.startswith(f"{ds}.G4.") and x.name.endswith(peer)), None)
            if g4:
                rows.append(
                    {
                        "goal": f">= {goal:g}x {peer} at the same budget",
                        "dataset": label,
                        "measured": f"{g4.value:.2f}x",
                        "verdict": _verdict(g4.value >= goal),
                        "cause": "mmap cold, rate extrapolated from rows read (no batch finished in its time box)"
                        if peer == "mmap"
                        else "one O_DIRECT pread per missed row behind the same cache",
                    }
                )
        m = metrics[ds]
        n_in = sum(m["stages_within"].values())
        n_all = sum(len(v) for v in m["stage_ratios"].values())
        spread = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in m["stage_ratios"].items()}
        rows.append(
            {
                "goal": "stage predictions within +-15%",
                "dataset": label,
                "measured": f"{n_in} of {n_all}; predicted/measured "
                + ", ".join(f"{k} {v}" for k, v in spread.items()),
                "verdict": _verdict(n_in == n_all),
                "cause": "sample: profiled alone, measured behind the training kernels on one stream "
                "(the model now adds them); transfer: pageable copies and the CPU gather in assemble (fixed); disk: "
                "the additive form over-prices this disk (calibration now measures the form)",
            }
        )
        mem = m["model_now"]["in-memory"]
        rows.append(
            {
                "goal": "model: in-memory throughput (lanes)",
                "dataset": label,
                "measured": f"predicted {mem['predicted']:.0f} vs measured {mem['measured']:.0f} "
                f"({mem['predicted'] / mem['measured']:.2f}x); recorded model {mem['old_model']:.0f}",
                "verdict": _verdict(abs(mem["predicted"] / mem["measured"] - 1) <= TOL),
                "cause": "this tree's model re-run on the record's workload (after the fact)",
            }
        )
        rows.append(
            {
                "goal": "recommended configuration >= 90% of best",
                "dataset": label,
                "measured": "no alternative ran at the peer budget",
                "verdict": _verdict(None),
                "cause": "cut by the deadline (" + ", ".join(k for k in m["skipped"] if "ablations" in k) + ")",
            }
        )
    return rows


def main() -> None:
    figures: list[Figure] = []
    metrics: dict[str, Any] = {}
    for ds, name in RECORDS.items():
        rec = _load(name)
        machine = MachineSpec.from_dict(rec["metrics"]["machine"])
        g3_figs, g3 = _g3(ds, rec, machine)
        g5_figs, g5 = _g5_model(ds, rec, machine)
        stages = _g5_stages(rec)
        figures += [*_g2(ds, rec), *g3_figs, *_g4(ds, rec), *g5_figs]
        metrics[ds] = {
            "record": name,
            "disk_bound": g3,
            "stage_ratios": stages,
            "stages_within": {k: sum(abs(x - 1) <= TOL for x in v) for k, v in stages.items()},
            "model_now": g5,
            "recommended": rec["metrics"].get("recommended"),
            "skipped": rec["metrics"]["skipped"],
        }
        metrics[f"plan_{ds}"], metrics[f"plan_as_run_{ds}"] = _plans(name)
    metrics["goals"] = _goals(metrics, figures)
    rec = make_record(
        name="gnn_goals_h200_s8",
        figures=figures,
        config={"records": sorted(RECORDS.values()), "tolerance": TOL},
        metrics=metrics,
        notes="Computed on the CPU from the committed session-8 H200 records; no new measurement. G3 prices "
        "the IOs and pages each run issued per batch with the record's calibration; G5 re-runs this tree's "
        "cost model on the record's machine and workload (hotness curve at every 10th point, as stored).",
    )
    print(write_record(rec))
    for f in figures:
        print(f"{f.name:48s} {f.value:12.4g} {f.unit:8s} {f.peers}")
    for ds in RECORDS:
        v = metrics[ds]
        print(ds, "within", v["stages_within"], {k: [round(x, 2) for x in r] for k, r in v["stage_ratios"].items()})


if __name__ == "__main__":
    main()
