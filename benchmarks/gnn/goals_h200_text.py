"""The goals table of ``goals_h200.py``: one row per goal and dataset, its numbers read from the metrics.

The measured cause of each miss is a sentence per session (:data:`CAUSES`) around figures taken from
the metrics, so the table and the record cannot disagree.
"""

from __future__ import annotations

from typing import Any

from outofcore_record import TOLERANCE as TOL

LABEL = {"papers": "papers-like", "igb": "IGB-like"}


def _ms(x: float) -> str:
    return f"{x:.1f} ms"


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "not met")


def _g2_cause_papers(g2: dict[str, Any]) -> str:
    c, mem = g2["measured_lanes"]["carina@1"], g2["measured_lanes"]["in-memory"]
    return (
        f"not the host gather: the IO thread's read stage took {_ms(c['read_ms'])} of a {_ms(c['batch_ms'])} batch; "
        f"the sampler thread (sample + cache lookup) took {_ms(c['sample_plan_ms'])} a batch against "
        f"{_ms(mem['sample_plan_ms'])} in memory ({_ms(mem['batch_ms'])} batches), assemble {_ms(c['assemble_ms'])}, "
        f"the step {_ms(c['train_ms'])}: the device lane (sampler, copies, step on one stream) is the bound, "
        f"+{c['batch_ms'] - mem['batch_ms']:.1f} ms a batch over in memory, of which the model prices the copy of "
        "the host hits (about 1 ms); the rest (the lookup's host synchronisations, contention with the IO "
        "thread) is not separable in the record. Model: the CPU path (as run) predicted "
        f"{g2['predicted_now']['carina@1 cpu path'] / g2['predicted_now']['in-memory']:.2f}x in-memory, "
        "the device path "
        f"{g2['predicted_now'].get('carina@1 device path', 0) / g2['predicted_now']['in-memory']:.2f}x (modeled)"
    )


def _g2_cause_igb(g2: dict[str, Any]) -> str:
    c = g2["measured_lanes"]["carina@1"]
    dev = g2["predicted_now"].get("carina@1 device path", 0) / g2["predicted_now"]["in-memory"]
    return (
        f"the host gather on the CPU: the IO thread's read stage (the host hits, 451 MB a batch) took "
        f"{_ms(c['read_ms'])} of a {_ms(c['batch_ms'])} batch; the model predicts IO above compute "
        f"({g2['condition_recorded']['io_over_device']:.2f}x as recorded, {g2['condition_now']['io_over_device']:.2f}x "
        "now), so the goal's condition does not hold for this run as it ran. With the hits gathered by the GPU "
        f"from the mapped host slice (StoreConfig.host_gather=device, added) the model predicts {dev:.2f}x "
        "in-memory, IO no longer on the IO thread (modeled, from the zero-copy peer's rate in the same run)"
    )


def span(r: dict[str, float]) -> str:
    """A ratio range over the in-memory runs, to three places (0.897 is not 0.9)."""
    return f"{min(r.values()):.3f}-{max(r.values()):.3f}x"


def _g2_cause_sampler(g2: dict[str, Any]) -> str:
    """Session 11's lane: both host paths at 100% cache, the sampler on a stream of its own."""
    c, mem, o = g2["measured_lanes"]["carina@1"], g2["measured_lanes"]["in-memory"], g2["other_path"]
    ol, pn = o["measured_lanes"], g2["predicted_now"]
    pc, pd = pn["carina@1 cpu path"], pn.get("carina@1 device path", 0.0)
    return (
        f"the sampler thread, not IO: carina@1 (the model's pick, {g2['host_path']} host path) ran "
        f"{_ms(c['batch_ms'])} batches with its sampler thread (sampling and the cache lookup, on a stream of its "
        f"own) at {_ms(c['sample_plan_ms'])} a batch, against {_ms(mem['sample_plan_ms'])} in memory "
        f"({_ms(mem['batch_ms'])} batches); the IO thread {_ms(c['read_ms'])}, the step {_ms(c['train_ms'])} "
        f"({_ms(mem['train_ms'])} in memory). The {o['host_path']} path ran {_ms(ol['batch_ms'])} batches "
        f"({span(o['ratios'])} in-memory; sampler thread {_ms(ol['sample_plan_ms'])}, IO thread "
        f"{_ms(ol['read_ms'])}). The model priced the two paths within {abs(pd / pc - 1):.1%} ({pc:.0f} cpu, "
        f"{pd:.0f} device seeds/s) and in memory at {pn['in-memory']:.0f}: it has no term for the sampler "
        "slowing down beside the cache's work, and the record does not separate why it does (its timers are "
        "CPU times around queued GPU work)"
    )


def _g2_row(ds: str, g2: dict[str, Any], session: str = "s9") -> dict[str, str]:
    r = g2["ratios"]
    cond = g2["condition_now"]["io_over_device"]
    applies = cond <= 0.8
    lo, hi = min(r.values()), max(r.values())
    measured = f"carina@1 {lo:.2f}-{hi:.2f}x in-memory ({g2['carina@1']:.0f} seeds/s; in-memory "
    if "other_path" in g2:
        o = g2["other_path"]
        measured = (
            f"carina@1 ({g2['host_path']} path) {span(r)} in-memory ({g2['carina@1']:.0f} seeds/s), "
            f"{o['host_path']} path {span(o['ratios'])} ({o['seeds_per_s']:.0f}; in-memory "
        )
    best = max(hi, max(g2["other_path"]["ratios"].values()) if "other_path" in g2 else hi)
    by_dataset = _g2_cause_papers if ds == "papers" else _g2_cause_igb
    cause = _g2_cause_sampler(g2) if session == "s11" else by_dataset(g2)
    return {
        "goal": ">= 0.9x in-memory where the model predicts IO <= 0.8x compute",
        "dataset": LABEL[ds],
        "target": "0.9x",
        "measured": measured
        + " / ".join(f"{v:.0f}" for v in g2["in_memory"].values())
        + f"); IO/compute predicted {g2['condition_recorded']['io_over_device']:.2f} (recorded), {cond:.2f} (now)",
        "verdict": verdict(best >= 0.9) if applies else "not met (condition does not hold: IO-bound)",
        "cause": cause,
    }


def _g3_row(ds: str, rows: dict[str, dict[str, float]], form: str, iops: float, cause: str) -> dict[str, str]:
    ratio = {k: v[form] / v["batch_s"] for k, v in rows.items()}
    within = sum(abs(x - 1) <= TOL for x in ratio.values())
    lo, hi = _implied_kiops(rows)
    return {
        "goal": "within 15% of the disk bound where IO-bound",
        "dataset": LABEL[ds],
        "target": "0.85-1.15x",
        "measured": ", ".join(f"{k.removeprefix('carina').strip()} {x:.2f}x" for k, x in ratio.items()),
        "verdict": f"{within} of {len(ratio)} within; all at or above the bound"
        if min(ratio.values()) >= 1
        else f"{within} of {len(ratio)} within",
        "cause": f"disk time the calibration allows for the reads each run issued ({form} form) over the measured "
        f"batch: the runs issued {lo:.0f}-{hi:.0f}k IOs/s a batch against the calibration's {iops / 1e3:.0f}k"
        + (f"; {cause}" if cause else ""),
    }


def _implied_kiops(rows: dict[str, dict[str, float]]) -> tuple[float, float]:
    """The lowest and highest IOs a second (thousands) that the disk-bound runs issued over their batches."""
    implied = [v["ios"] / v["batch_s"] / 1e3 for v in rows.values()]
    return min(implied), max(implied)


def _g5_row(ds: str, sc: dict[str, Any], cause: str) -> dict[str, str]:
    rec, now, run = sc["recorded"], sc["now"], sc["now_in_run_rates"]
    spread = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in run["ratios"].items()}
    return {
        "goal": "stage-time predictions within +-15%",
        "dataset": LABEL[ds],
        "target": "all pairs",
        "measured": f"recorded {rec['within']} of {rec['pairs']}; re-predicted (modeled) with the lane's "
        f"calibration {now['within']} of {now['pairs']}, with the in-run rates {run['within']} of {run['pairs']}; "
        f"own-timer pairs (read stage, batch) {rec['within_own']} recorded, {run['within_own']} with the in-run "
        f"rates, of {run['own']}; predicted/measured with the in-run rates "
        + ", ".join(f"{k} {v}" for k, v in spread.items()),
        "verdict": verdict(run["within"] == run["pairs"]),
        "cause": cause,
    }


def _g6_row(ds: str, g6: dict[str, Any], cause: str) -> dict[str, str]:
    r = g6["recorded"]
    return {
        "goal": "recommended configuration >= 90% of the best measured",
        "dataset": LABEL[ds],
        "target": "0.9x",
        "measured": f"{r['picked']} {r['ratio']:.2f}x {r['best_measured']} ("
        + ", ".join(f"{k.removeprefix('carina').strip()} {v:.0f}" for k, v in r["measured"].items())
        + " seeds/s)",
        "verdict": verdict(r["ratio"] >= 0.9),
        "cause": cause if r["ratio"] < 0.9 else "",
    }


def goal_rows(
    metrics: dict[str, Any], causes: dict[str, str], form: str, iops: float, session: str = "s9"
) -> list[dict]:
    """The goals table of a session, one row per goal and dataset (those its records have inputs for).

    ``form`` and ``iops`` are the lane's calibration's disk cost form and IOPS.
    """
    rows = []
    for ds in ("papers", "igb"):
        m = metrics[ds]
        if m.get("g2"):
            rows.append(_g2_row(ds, m["g2"], session))
        if m.get("disk_bound"):
            rows.append(_g3_row(ds, m["disk_bound"], form, iops, causes.get("g3", "")))
        rows.append(_g5_row(ds, m["stage_checks"], causes.get("g5", "")))
        if m.get("recommended"):
            rows.append(_g6_row(ds, m["recommended"], causes.get(f"g6_{ds}", "")))
        pm = m["in_memory_model"]
        rows.append(
            {
                "goal": "model: in-memory throughput (device lane)",
                "dataset": LABEL[ds],
                "target": "+-15%",
                "measured": f"predicted {pm['predicted']:.0f}, measured "
                + " / ".join(f"{v:.0f}" for v in pm["measured"].values()),
                "verdict": verdict(all(abs(pm["predicted"] / v - 1) <= TOL for v in pm["measured"].values())),
                "cause": causes.get("mem", ""),
            }
        )
    return rows


CAUSES: dict[str, dict[str, str]] = {
    "s8": {},
    "s11": {
        "g3": "the pick (carina@0.5) ran first and read its batches slower than the same configuration run "
        "again last (read stage 959.7 against 726.0 ms a call): the disk's drift between runs again",
        "g5": "sample is the sampler thread's CPU time around its stream's queued kernels, waits included, "
        "against kernels priced alone (it is under-predicted in memory too); assemble (transfer) is CPU time "
        "around asynchronous copies and gathers, their queuing rather than their run (the device path's "
        "gather of the host hits hardly shows in it); compute is within 15% on every run",
        "g6_papers": "the model priced the three configurations at 50% within 2% of each other (10,222-10,388 "
        "seeds/s predicted); the pick ran first at 7,879 and again last at 11,418 seeds/s (its figure is the "
        "mean of the two), within 1% of the best (gap 0, 11,479): the spread is the disk's drift between runs",
        "mem": "in memory the batch is the sampler thread's time, the step is shorter (6.0 ms papers-like, "
        "24.1 ms IGB-like); the three in-memory runs of one record differ by up to 17% (papers-like) and 16% "
        "(IGB-like)",
    },
    "s9": {
        "g3": "the calibration's IOPS came from 16,384 reads in the lane's first seconds, and the same batches "
        "read faster in later runs (carina@0.5 ran first)",
        "g5": "sample, transfer and compute are timed on the CPU around work queued on the one CUDA stream the "
        "sampler, the copies and the step share, so each holds waits for the others' kernels (sample 0.1-0.4x "
        "predicted/measured); the read stage averages every read, the first included (a fresh page buffer and "
        "the disk's ramp: IGB-like carina@0.5 read 1,262 ms a call while batches came every 990 ms); the "
        "calibrated IOPS were below the runs'. Fixed in the model: the additive form charged each read's first "
        "page twice, and the calibration timed page faults of a fresh output as host gather (4.26 GB/s, the "
        "runs' own peer 9.3-9.9); in the bench: per-call stage times, warm-up dropped",
        "g6_papers": "the model priced the four configurations within 4% of each other (6,009-6,272 seeds/s "
        "predicted); measured they spread 9,212-10,677 with the pick run first, and the pick's own serial "
        "variant (no-pipelining: the same gap, the same reads) ran 5% faster than it: the spread is the disk's "
        "drift between runs (the same batches read faster later), which the next lane meets by running the "
        "pick again after the alternatives",
        "mem": "in memory the device lane is the sampler's and the step's kernels one after another on one "
        "stream (profiled alone: 6.7 + 5.9 ms papers-like, 6.2 + 24.2 ms IGB-like); the two in-memory runs "
        "of each record differ by 8% and 18%",
    },
}


def per_dataset(ok: dict[str, bool]) -> str:
    """``met``, ``not met`` or ``met on <datasets>, not on <datasets>``."""
    yes, no = [LABEL[d] for d, v in ok.items() if v], [LABEL[d] for d, v in ok.items() if not v]
    if not no:
        return "met"
    return f"met on {', '.join(yes)}, not on {', '.join(no)}" if yes else "not met"


def _g2_status(metrics: dict[str, Any], rec: str) -> dict[str, str]:
    p, i = metrics["papers"]["g2"], metrics["igb"]["g2"]
    applies = {ds: metrics[ds]["g2"]["condition_now"]["io_over_device"] <= 0.8 for ds in ("papers", "igb")}

    def best(ds: str, g2: dict[str, Any]) -> str:
        cond = g2["condition_now"]["io_over_device"]
        return f"{max(g2['ratios'].values()):.2f}x (IO/compute {cond:.2f} now" + (
            ")" if applies[ds] else ": condition does not hold)"
        )

    met = {ds: max(metrics[ds]["g2"]["ratios"].values()) >= 0.9 for ds, a in applies.items() if a}
    return {
        "goal": ">= 0.9x in-memory where the model predicts IO <= 0.8x compute",
        "target": "0.9x",
        "best": f"papers-like carina@1 {best('papers', p)}; IGB-like {best('igb', i)}",
        "record": rec,
        "verdict": per_dataset(met) if met else "condition holds on neither dataset",
        "cause": "papers-like: the device lane (sampler, lookup, copies and step on one stream), not the host gather "
        f"({p['measured_lanes']['carina@1']['read_ms']:.1f} of {p['measured_lanes']['carina@1']['batch_ms']:.1f} ms); "
        f"IGB-like: the IO thread's CPU gather of the host hits ({i['measured_lanes']['carina@1']['read_ms']:.1f} of "
        f"{i['measured_lanes']['carina@1']['batch_ms']:.1f} ms), now served by the GPU in place (modeled "
        f"{i['predicted_now']['carina@1 device path'] / i['predicted_now']['in-memory']:.2f}x, not measured)",
    }


def _g3_status(metrics: dict[str, Any], rec: str, s8: dict[str, float]) -> dict[str, str]:
    bound = {f"{ds} {k}": v for ds in ("papers", "igb") for k, v in metrics[ds]["disk_bound"].items()}
    ratios = [v["additive"] / v["batch_s"] for v in bound.values()]
    over = [v["overlapped"] / v["batch_s"] for v in bound.values()]
    s8_g3 = [v for k, v in s8.items() if ".G3." in k]
    lo, hi = _implied_kiops(bound)
    within = sum(abs(x - 1) <= TOL for x in ratios)
    above = ": at or above the bound" if min(ratios) >= 1 else ""
    return {
        "goal": "within 15% of the disk bound where IO-bound",
        "target": "0.85-1.15x",
        "best": f"s9: {within} of {len(ratios)} runs within (additive form; overlapped "
        f"{sum(abs(x - 1) <= TOL for x in over)}), all {min(ratios):.2f}-{max(ratios):.2f}x{above}; "
        f"s8: {sum(abs(x - 1) <= TOL for x in s8_g3)} of {len(s8_g3)} (overlapped)",
        "record": f"{rec}, gnn_goals_h200_s8",
        "verdict": verdict(within == len(ratios)),
        "cause": f"the runs issued {lo:.0f}-{hi:.0f}k IOs/s a batch; the calibration's IOPS came from 16,384 reads, "
        "and the same batches read faster in later runs" + ("; carina is not below the bound" if above else ""),
    }


def g4_status(s8: dict[str, float]) -> dict[str, str]:
    """The mmap and synchronous-reads goal, from session 8's goals record (the only run of both peers)."""
    g4 = {k: v for k, v in s8.items() if ".G4." in k}
    g4_goal = {"mmap": 3.0, "sync-reads": 1.5}
    return {
        "goal": ">= 3x mmap and >= 1.5x synchronous reads at the same cache budget",
        "target": "3x, 1.5x",
        "best": "carina@0.5 over: "
        + ", ".join(f"{LABEL[k.split('.')[0]]} {k.split('_over_')[1]} {v:.2f}x" for k, v in g4.items()),
        "record": "gnn_goals_h200_s8",
        "verdict": verdict(all(v >= g4_goal[k.split("_over_")[1]] for k, v in g4.items()) if g4 else None),
        "cause": "",
    }


def mem_status(metrics: dict[str, Any], rec: str) -> dict[str, str]:
    """The model's in-memory throughput against the in-memory runs, per dataset."""
    mem = {ds: metrics[ds]["in_memory_model"] for ds in ("papers", "igb")}
    mem_ok = {ds: all(abs(m["predicted"] / v - 1) <= TOL for v in m["measured"].values()) for ds, m in mem.items()}
    return {
        "goal": "model: in-memory throughput",
        "target": "+-15%",
        "best": "; ".join(
            f"{LABEL[ds]} {m['predicted']:.0f} predicted vs " + " / ".join(f"{v:.0f}" for v in m["measured"].values())
            for ds, m in mem.items()
        ),
        "record": rec,
        "verdict": per_dataset(mem_ok),
        "cause": "; ".join(
            f"the in-memory runs of the {LABEL[ds]} record differ by "
            f"{max(m['measured'].values()) / min(m['measured'].values()) - 1:.0%}"
            for ds, m in mem.items()
            if not mem_ok[ds]
        ),
    }


def status_rows(metrics: dict[str, Any], s8: dict[str, float], rec: str) -> list[dict[str, str]]:
    """One row per benchmark goal of issue #8, across both H200 sessions; verdicts from the numbers."""
    stage = {ds: metrics[ds]["stage_checks"] for ds in ("papers", "igb")}
    rp = {ds: metrics[ds]["recommended"]["recorded"]["ratio"] for ds in ("papers", "igb")}
    return [
        _g2_status(metrics, rec),
        _g3_status(metrics, rec, s8),
        g4_status(s8),
        {
            "goal": "stage-time predictions within +-15% of measured",
            "target": "every stage",
            "best": "; ".join(
                f"{LABEL[ds]} {v['recorded']['within']}/{v['recorded']['pairs']} recorded, re-predicted (modeled) "
                f"{v['now']['within']}/{v['now']['pairs']} with the lane's calibration and "
                f"{v['now_in_run_rates']['within']}/{v['now_in_run_rates']['pairs']} with the in-run rates"
                for ds, v in stage.items()
            ),
            "record": rec,
            "verdict": per_dataset(
                {ds: v["now_in_run_rates"]["within"] == v["now_in_run_rates"]["pairs"] for ds, v in stage.items()}
            ),
            "cause": "sample, transfer and compute timers run on the CPU around one shared CUDA stream (they "
            "measure waits); the read stage's average holds the warm-up read; the calibration's IOPS and "
            "host gather rate were low. Model and bench fixed; sample and transfer need their own streams "
            "or device timers to be measured alone",
        },
        {
            "goal": "recommended configuration >= 90% of the best measured",
            "target": "0.9x",
            "best": f"IGB-like {rp['igb']:.2f}x, papers-like {rp['papers']:.2f}x",
            "record": rec,
            "verdict": per_dataset({ds: r >= 0.9 for ds, r in rp.items()}),
            "cause": "papers-like: the configurations were predicted within 4% of each other and measured "
            "within the disk's drift between runs (the pick ran first)"
            if rp["papers"] < 0.9
            else "",
        },
        mem_status(metrics, rec),
    ]
