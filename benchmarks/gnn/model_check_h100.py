"""Re-check the disk cost model against the committed H100 records (CPU only, no new measurement).

Reads ``benchmarks/results/<machine>/gnn_*.json`` (``h100`` by default) and, for every carina run in them, prices the
disk reads the run actually made (its IO and page counts per batch) with both disk cost
forms of :func:`carina.gnn.diskcost.disk_seconds`: ``additive`` (a request's own cost plus its
bytes at the bandwidth; ``IOs / IOPS + bytes / bandwidth`` until session 10, when the committed
``gnn_model_check_h100`` was made) and ``overlapped`` (``max`` of the two, the form the records'
predictions used), and compares them with the measured time per batch. For the single-GPU placement
record it re-solves each batch's LP with the disk link at the additive rate. It also
repeats the full prediction (IO counts modeled too) of the IGB-like and first papers-like
records from their stored machine and workload (the records keep every 10th point of the
hotness curve, so the overlapped recomputation is shown next to the record's own value)::

    PYTHONPATH=$PWD/src python benchmarks/gnn/model_check_h100.py
    PYTHONPATH=$PWD/src python benchmarks/gnn/model_check_h100.py --machine h200   # session 3's H200 records

A machine's folder may lack some of the records (the H200 has the determinism and placement
records only): the checks whose records are missing are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.gnn.costmodel import MachineSpec, WorkloadProfile, disk_seconds, predict
from carina.gnn.placement.schedule import Demand, schedule_lp

sys.path.insert(0, str(Path(__file__).parent))
from bench_placement_e2e import topology  # the one-GPU topology the placement record used

RESULTS = Path(__file__).resolve().parents[1] / "results"
MACHINE = "h100"  # set from --machine
PAGE = 4096


def _path(name: str) -> Path:
    return RESULTS / MACHINE / f"{name}_{MACHINE}.json"


def _load(name: str) -> dict:
    return json.loads(_path(name).read_text())


def _runs() -> list[tuple[str, dict, dict, int, int]]:
    """(label, carina run, machine dict, batches counted, batch size) for every carina run."""
    out = []
    if _path("gnn_outofcore").is_file():
        first = _load("gnn_outofcore")
        for b, run in first["metrics"]["carina"].items():
            out.append((f"papers-like@{b} (first run)", run, first["metrics"]["machine"], 10, 1024))
    machine = None
    if _path("gnn_outofcore_igb").is_file():
        igb = _load("gnn_outofcore_igb")
        machine = igb["metrics"]["machine"]  # calibrated in the same device run as the determinism record
        for b, run in igb["metrics"]["carina"].items():
            out.append((f"igb-like@{b}", run, machine, 6, 256))
    if _path("gnn_determinism").is_file():
        det = _load("gnn_determinism")
        machine = machine or det["metrics"].get("machine") or _load("gnn_placement_e2e")["metrics"]["machine"]
        for mode, runs in det["metrics"]["modes"].items():
            for k, run in runs.items():
                if "fetch" in run:
                    out.append((f"papers-like {k.split('@')[1]} ({mode})", run, machine, 6, 1024))
    return out


def _disk_figures() -> tuple[list[Figure], dict]:
    figures, rows = [], {}
    for label, run, mdict, nb, bs in _runs():
        f = run["fetch"]
        ios, pages = f["ios"] / nb, f["pages"] / nb
        measured_ms = bs / run["seeds_per_s"] * 1e3
        t = {
            c: disk_seconds(MachineSpec.from_dict(mdict | {"disk_cost": c}), ios, pages) * 1e3
            for c in ("additive", "overlapped")
        }
        rows[label] = {"ios_per_batch": ios, "pages_per_batch": pages, "measured_batch_ms": measured_ms} | {
            f"{c}_disk_ms": v for c, v in t.items()
        }
        figures.append(
            Figure(
                name=f"{label}.disk_ms_additive",
                value=t["additive"],
                unit="ms",
                higher_is_better=False,
                basis=Basis.MODELED,
                peers={"measured batch": measured_ms, "overlapped (max) form": t["overlapped"]},
            )
        )
    return figures, rows


def _e2e_figures() -> tuple[list[Figure], dict]:
    rec = _load("gnn_placement_e2e")
    m = rec["metrics"]
    machine = MachineSpec.from_dict(m["machine"] | {"disk_cost": "additive"})
    recorded_form = m["machine"].get("disk_cost", "overlapped")  # records before session 2's fix lack the key
    row_bytes = m["dataset"]["row_bytes"]
    pred, meas = [], []
    for row in m["batches"]:
        disk_b = row["pages"] * PAGE
        rate = disk_b / disk_seconds(machine, row["ios"], row["pages"]) / 1e9
        demand = [Demand("ssd0", "gpu0", disk_b / 1e9), Demand("dram0", "gpu0", row["host_rows"] * row_bytes / 1e9)]
        pred.append(schedule_lp(topology(machine, rate), demand).time_s)
        meas.append(row["measured_s"])
    ratios = [a / b for a, b in zip(meas, pred, strict=True)]
    fig = Figure(
        name="placement e2e.batch_transfer_ms_additive",
        value=float(np.mean(pred)) * 1e3,
        unit="ms",
        higher_is_better=False,
        basis=Basis.MODELED,
        peers={"measured": float(np.mean(meas)) * 1e3, f"LP as recorded ({recorded_form})": figure(rec, "predicted")},
    )
    stats = {"mean": float(np.mean(ratios)), "min": min(ratios), "max": max(ratios)}
    return [fig], {"predicted_s": pred, "measured_s": meas, "measured_over_predicted": stats}


def figure(rec: dict, prefix: str) -> float:
    """Value of the record's first figure whose name starts with ``prefix``."""
    return next(f["value"] for f in rec["figures"] if f["name"].startswith(prefix))


def _full_predictions() -> tuple[list[Figure], dict]:
    figures, out = [], {}
    for name, gap_key in (("gnn_outofcore_igb", "gap_pages"), ("gnn_outofcore", None)):
        if not _path(name).is_file():
            continue
        rec = _load(name)
        m = rec["metrics"]
        work = WorkloadProfile.from_dict(m["workload"])
        gap = m.get(gap_key, 0) if gap_key else 0  # the first run predates hole merging
        for b, run in m["carina"].items():
            n, frac = work.num_nodes, float(b)
            kw = {"gpu_cache_rows": int(frac / 3 * n), "host_cache_rows": int(2 * frac / 3 * n), "gap_pages": gap}
            p = {
                c: predict(MachineSpec.from_dict(m["machine"] | {"disk_cost": c}), work, **kw).seeds_per_s
                for c in ("additive", "overlapped")
            }
            label = f"{ {'gnn_outofcore_igb': 'igb-like', 'gnn_outofcore': 'papers-like'}[name] }@{b}"
            out[label] = p | {"recorded_prediction": run["predicted"]["seeds_per_s"], "measured": run["seeds_per_s"]}
            figures.append(
                Figure(
                    name=f"{label}.predicted_seeds_per_s_additive",
                    value=p["additive"],
                    unit="seeds/s",
                    basis=Basis.MODELED,
                    peers={
                        "measured": run["seeds_per_s"],
                        "recorded prediction (overlapped)": out[label]["recorded_prediction"],
                    },
                )
            )
    return figures, out


def main() -> None:
    global MACHINE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100", help="results folder whose gnn records are checked")
    MACHINE = ap.parse_args().machine
    disk_figs, disk_rows = _disk_figures()
    e2e_figs, e2e = _e2e_figures()
    full_figs, full = _full_predictions()
    rec = make_record(
        name=f"gnn_model_check_{MACHINE}",
        figures=[*disk_figs, *e2e_figs, *full_figs],
        config={"records": sorted(p.name for p in (RESULTS / MACHINE).glob("gnn_*.json"))},
        metrics={"disk_from_measured_counts": disk_rows, "placement_e2e": e2e, "full_predictions": full},
        notes=f"Computed on the CPU from the committed {MACHINE} records; no new measurement. disk_ms_* price the IOs "
        "and pages each run actually read (per batch, warm-up batches included in the counts) and are compared "
        "with the measured time per batch; the overlapped form is the one the records' predictions used.",
    )
    print(write_record(rec))
    for label, r in disk_rows.items():
        print(
            f"{label:34s} measured {r['measured_batch_ms']:7.1f} ms  additive {r['additive_disk_ms']:7.1f}  "
            f"overlapped {r['overlapped_disk_ms']:7.1f}"
        )
    s = e2e["measured_over_predicted"]
    print(f"placement e2e measured/additive LP: mean {s['mean']:.2f} range {s['min']:.2f}-{s['max']:.2f}")
    for label, r in full.items():
        print(f"{label:34s} " + "  ".join(f"{k} {v:.0f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
