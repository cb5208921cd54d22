"""The JSON record of ``bench_outofcore.py``: figures, per-system metrics and equality checks.

:func:`write` is called after every system, so the record holds whatever has finished.
"""

from __future__ import annotations

from typing import Any

from carina.core.bench import Basis, Figure, make_record, write_record

_DROP = ("losses", "row_checksums")


def _strip(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in _DROP}


def _prefix_equal(a: list, b: list) -> bool:
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def _ceiling(bench: Any) -> float | None:
    runs = [bench.results[k]["seeds_per_s"] for k in ("in-memory", "in-memory again") if k in bench.results]
    return max(runs) if runs else None


def recommended(bench: Any) -> dict[str, Any] | None:
    """The model's pick among the configurations measured at the peer budget, against the best measured."""
    pb = bench.peer_budget
    cands = ({f"carina@{pb:g}": bench.carina[pb]} if pb in bench.carina else {}) | {
        f"carina {k}": v for k, v in bench.ablations.items()
    }
    if len(cands) < 2:
        return None
    pick = max(cands, key=lambda k: cands[k]["predicted"]["seeds_per_s"])
    best = max(cands, key=lambda k: cands[k]["seeds_per_s"])
    return {
        "picked": pick,
        "best_measured": best,
        "ratio": cands[pick]["seeds_per_s"] / cands[best]["seeds_per_s"] if cands[best]["seeds_per_s"] else 0.0,
        "measured": {k: v["seeds_per_s"] for k, v in cands.items()},
        "predicted": {k: v["predicted"]["seeds_per_s"] for k, v in cands.items()},
    }


# predicted stage -> its measured seconds per batch (stage totals / times the stage ran). The sampler
# thread also plans each batch (cache lookup, page runs), which the model does not price: "sample" is
# compared with sample + plan, the lane the prediction stands for. The assemble stage holds the
# benchmark's own row checks, taken out (check_s).
_MEASURED = {
    "sample": lambda r: _sum_per(r, ("sample", "plan")),
    "disk": lambda r: _sum_per(r, ("read",)),
    "transfer": lambda r: _sum_per(r, ("assemble",), minus=r.get("check_s", 0.0)),
    "compute": lambda r: r["train_s"] / r["batches"] if r.get("batches") and "train_s" in r else None,
}
TOLERANCE = 0.15  # the issue's +-15% on stage-time predictions


def _sum_per(run: dict, stages: tuple[str, ...], minus: float = 0.0) -> float | None:
    n = run.get("stage_n", {}).get(stages[0], 0)
    return max(0.0, sum(run["stage_s"][s] for s in stages) - minus) / n if n else None


def stage_check(run: dict) -> dict[str, dict[str, float]]:
    """Predicted against measured seconds per batch, stage by stage and for the whole batch."""
    pred = run["predicted"]
    # the read stage (IO thread) also gathers the host-cache hits since session 8: the model's "gather"
    # joins the disk there (records made before have no "gather" stage and gathered in assemble)
    stages = pred["stages"] | {"disk": pred["stages"].get("disk", 0.0) + pred["stages"].get("gather", 0.0)}
    out: dict[str, dict[str, float]] = {}
    for stage, fn in _MEASURED.items():
        got = fn(run)
        if got is not None and stage in pred["stages"]:
            out[stage] = {"predicted_s": stages[stage], "measured_s": got}
    if run.get("seeds_per_s") and "batch_s" in pred:
        out["batch"] = {"predicted_s": pred["batch_s"], "measured_s": run["batch_size"] / run["seeds_per_s"]}
    for v in out.values():
        v["predicted_over_measured"] = v["predicted_s"] / v["measured_s"] if v["measured_s"] else float("inf")
    return out


def stage_summary(bench: Any) -> dict[str, Any]:
    """Every carina run's stage check, and the share of (run, stage) pairs within the tolerance."""
    runs = {f"carina@{b:g}": r for b, r in bench.carina.items()}
    runs |= {f"carina {k}": r for k, r in bench.ablations.items()}
    checks = {k: stage_check(r | {"batch_size": bench.args.batch_size}) for k, r in runs.items()}
    ratios = [v["predicted_over_measured"] for c in checks.values() for v in c.values()]
    within = sum(abs(x - 1) <= TOLERANCE for x in ratios)
    return {"runs": checks, "within": within, "pairs": len(ratios), "tolerance": TOLERANCE}


def figures(bench: Any) -> list[Figure]:
    ceiling = _ceiling(bench)
    peers_pb = {k: v["seeds_per_s"] for k, v in bench.results.items() if not k.startswith("in-memory")}
    peers_pb |= {f"carina {k}": v["seeds_per_s"] for k, v in bench.ablations.items()}
    out = []
    for b, run in sorted(bench.carina.items()):
        peers = ({"in-memory": ceiling} if ceiling else {}) | (peers_pb if b == bench.peer_budget else {})
        out.append(
            Figure(
                name=f"seeds_per_s@cache{b:g}",
                value=run["seeds_per_s"],
                unit="seeds/s",
                ceiling=ceiling,
                ceiling_source="in-memory run, same batches" if ceiling else "",
                peers=peers,
            )
        )
        out.append(
            Figure(
                name=f"predicted_seeds_per_s@cache{b:g}",
                value=run["predicted"]["seeds_per_s"],
                unit="seeds/s",
                basis=Basis.MODELED,
                peers={"measured": run["seeds_per_s"]},
            )
        )
    for b, run in sorted(bench.carina.items()):
        disk = stage_check(run | {"batch_size": bench.args.batch_size}).get("disk")
        if disk:
            out.append(
                Figure(
                    name=f"predicted_disk_ms@cache{b:g}",
                    value=disk["predicted_s"] * 1e3,
                    unit="ms",
                    basis=Basis.MODELED,
                    peers={"measured read stage": disk["measured_s"] * 1e3},
                )
            )
    summary = stage_summary(bench)
    if summary["pairs"]:
        out.append(
            Figure(
                name="stage_predictions_within_15pct",
                value=summary["within"] / summary["pairs"],
                unit="share",
                basis=Basis.MODELED,
            )
        )
    rec = recommended(bench)
    if rec:
        out.append(
            Figure(
                name=f"recommended_over_best@cache{bench.peer_budget:g}",
                value=rec["ratio"],
                unit="x",
                peers=rec["measured"],
            )
        )
    return out


def checks(bench: Any) -> dict[str, Any]:
    """Losses and row checksums of same-seed systems against in-memory; generator checks of the rest."""
    mem = bench.results.get("in-memory")
    runs = bench.results | {f"carina@{b:g}": r for b, r in bench.carina.items()} | bench.ablations
    out: dict[str, Any] = {
        "rows_exact_vs_generator": {
            k: v["rows_exact_vs_generator"] for k, v in runs.items() if "rows_exact_vs_generator" in v
        }
    }
    if mem is None:
        return out
    same = {k: v for k, v in runs.items() if k not in ("mmap", "sync-reads") or not bench.args.peer_seed_offset}
    out["losses_equal_to_in_memory"] = {k: _prefix_equal(v["losses"], mem["losses"]) for k, v in same.items()}
    out["rows_equal_to_in_memory"] = {
        k: _prefix_equal(v["row_checksums"], mem["row_checksums"]) for k, v in same.items()
    }
    out["max_abs_loss_diff"] = {
        k: max((abs(x - y) for x, y in zip(v["losses"], mem["losses"], strict=False)), default=0.0)
        for k, v in same.items()
    }
    out["in_memory_losses"] = mem["losses"]
    return out


def write(bench: Any) -> None:
    a = bench.args
    metrics = (
        {
            "systems": {k: _strip(v) for k, v in bench.results.items()},
            "carina": {f"{b:g}": _strip(r) for b, r in bench.carina.items()},
            "ablations": {k: _strip(v) for k, v in bench.ablations.items()},
            "recommended": recommended(bench),
            "stage_check": stage_summary(bench),
            "skipped": bench.skipped,
            "deterministic": a.deterministic,
            "gap_pages": bench.gap,
            "peer_budget": bench.peer_budget,
            "machine": bench.machine.to_dict(),
            "workload": bench.work.to_dict() | {"hotness_curve": bench.work.hotness_curve[::10]},
            "dataset": bench.ds.manifest.to_dict(),
        }
        | checks(bench)
        | bench.extra
    )
    rec = make_record(
        name=a.name,
        figures=figures(bench),
        config=vars(a) | {"data": str(a.data), "machine": str(a.machine)},
        metrics=metrics,
        notes="mmap: make_cold (fsync, POSIX_FADV_DONTNEED, drop_caches when root) before its run, residency "
        "before/after in systems.mmap.cold; budgets split 1/3 device, 2/3 host; peers and alternatives at "
        "peer_budget; rows_equal compares exact integer checksums of every assembled batch with in-memory's "
        "(same-seed systems), rows_exact_vs_generator each batch with the generator's rows; each system is "
        "time-boxed by --run-seconds (rate_basis says how its rate was taken).",
    )
    path = write_record(rec)
    done = {k: round(v["seeds_per_s"]) for k, v in bench.results.items()}
    done |= {f"carina@{b:g}": round(r["seeds_per_s"]) for b, r in bench.carina.items()}
    done |= {f"carina {k}": round(v["seeds_per_s"]) for k, v in bench.ablations.items()}
    print(f"{path}: seeds/s {done}", flush=True)
