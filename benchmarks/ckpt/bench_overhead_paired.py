"""Training overhead of a checkpoint every K steps, from interleaved blocks (noise-robust).

bench_overhead.py compares separate windows; on the H200 identical clean windows
differed by up to 39 %, more than a save adds. This benchmark times every step
and interleaves blocks of the same length in one process, per method and
interval K: ``clean, ckpt, clean, ckpt, ..., clean``. A checkpointed block opens
with one save (its blocking time counts) and runs K steps, longer while the save
is still in flight so the next clean block never overlaps it. Each checkpointed
block is compared with the two clean blocks around it (a linear drift of the step
time cancels), and the record gives the mean overhead with a 95 % Student-t
interval and a bootstrap interval (carina.ckpt.overhead), the null estimate of
the clean blocks against each other (the noise floor), and the goal's verdict:
``met`` (interval <= 3.5 %), ``missed`` (interval above it), ``unresolved``, or
``n/a`` when K x step < 2 x the time to persist: the larger of state bytes / the
disk's write bandwidth (measured in the same run) and the median save of the
blocks (the slowest is reported too). ``--intervals auto`` takes, per method,
the shortest K with K x step >= ``--interval-factor`` (2.5) x the slowest of
``--calib-saves`` timed saves made after the warm-up ones (or the ideal persist
time if longer): the hardest case the goal applies to, with a margin for a
drifting step time and slower saves (session 7 sized K at 2x the ideal persist
time; its saves took longer and its base step fell, so the goal stopped applying
partway through the run).
Pairs are added while the method's share of ``--budget-s`` lasts; the
record is written after every pair, with every step time.

    python benchmarks/ckpt/bench_overhead_paired.py --model llama --params 2e6 --methods carina-process
    python benchmarks/ckpt/bench_overhead_paired.py --model llama --params 350e6 --device cuda \\
        --methods carina-process --budget-s 110 --name ckpt_overhead_paired_h200
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_stall import size_label, warm_workload
from ckpt_methods import make_method
from ckpt_workload import PeakMemory, n_params, release_host_memory
from stall_record import env

from carina.ckpt.overhead import Block, null_overhead, paired_overhead, verdict
from carina.core.bench import Figure, make_record, write_record

GOAL_PCT = 3.5


def clean_block(step: Any, k: int) -> dict[str, Any]:
    """K steps without a save."""
    return {"steps_s": [round(step(), 6) for _ in range(k)]}


def ckpt_block(method: Any, step: Any, k: int, step_no: int, deadline_s: float) -> dict[str, Any]:
    """One save, then K steps or more until it is durable; which steps ran while it was in flight."""
    wall0, tb = time.time(), time.perf_counter()
    method.start(step_no)
    blocking = round(time.perf_counter() - tb, 6)
    steps: list[float] = []
    in_flight, durable = None, 0.0
    while len(steps) < k or in_flight is None:
        if in_flight is None and method.done():
            in_flight = len(steps)
            marker = method.durable_at()
            durable = (marker - wall0) if marker is not None else time.perf_counter() - tb
            if len(steps) >= k:
                break
        steps.append(round(step(), 6))
        if in_flight is None and time.perf_counter() - tb > deadline_s:
            raise TimeoutError(f"{method.name}: save not durable after {deadline_s:g} s ({len(steps)} steps)")
    return {"steps_s": steps, "blocking_s": blocking, "in_flight": in_flight, "durable_s": durable}


def run_interval(method: Any, step: Any, k: int, args: Any, counter: list[int], share_s: float,
                 on_pair: Any) -> dict[str, Any]:  # fmt: skip
    """clean, (ckpt, clean) x n for one method and K, while ``share_s`` lasts (>= ``--min-pairs``)."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"interval": k, "clean": [clean_block(step, k)], "ckpt": []}
    pair_s = 0.0
    while len(out["ckpt"]) < args.pairs:
        used = time.perf_counter() - t0
        if len(out["ckpt"]) >= args.min_pairs and used + pair_s > share_s:
            break
        tp = time.perf_counter()
        counter[0] += k
        out["ckpt"].append(ckpt_block(method, step, k, counter[0], args.save_deadline_s))
        out["clean"].append(clean_block(step, k))
        pair_s = time.perf_counter() - tp
        on_pair(out)
    return out


def calibrate(method: Any, step: Any, args: Any, counter: list[int]) -> list[float]:
    """Time until durable of ``--calib-saves`` saves, each with training steps running until it is."""
    out = []
    for _ in range(args.calib_saves):
        counter[0] += 1
        out.append(round(ckpt_block(method, step, 0, counter[0], args.save_deadline_s)["durable_s"], 3))
    return out


def resolve_intervals(spec: str, persist_s: float, step_s: float, factor: float, floor: int) -> list[int]:
    """``auto`` -> the shortest K with K x step >= factor x persist (at least ``floor``); ints as given."""
    auto = max(floor, math.ceil(factor * persist_s / step_s))
    return [auto if tok == "auto" else int(tok) for tok in spec.split(",") if tok]


def run_method(name: str, sub: Path, work: tuple[Any, Any, Any], args: Any, run: dict[str, Any],
               counter: list[int], t_start: float, methods_left: int) -> None:  # fmt: skip
    """One method over every interval; the record is rewritten after each pair."""
    model, opt, step = work
    res = run["methods"][name]
    m = make_method(name, sub, model, opt)
    try:
        for _ in range(args.warm_saves):  # untimed: both A/B arenas touched once, writer process, DCP plans
            counter[0] += 1
            m.start(counter[0])
            while not m.done():
                step()
        calib = calibrate(m, step, args, counter)
        persist = max([run["persist_s"], *calib])
        ks = resolve_intervals(args.intervals, persist, run["calibration_step_s"], args.interval_factor,
                               args.min_interval)  # fmt: skip
        res["calibration"] = {"durable_s": calib, "persist_s": round(persist, 3), "intervals": ks}
        for i, k in enumerate(ks):
            left = args.budget_s - (time.perf_counter() - t_start) if args.budget_s else math.inf
            share = left / (len(ks) * methods_left - i)

            def on_pair(out: dict[str, Any], k: int = k) -> None:
                res["intervals"][str(k)] = out
                write(args, run)

            run_interval(m, step, k, args, counter, share, on_pair)
    finally:
        m.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=2e6)
    ap.add_argument("--model", default="llama", choices=("mlp", "llama"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--intervals", default="auto", help="K list; 'auto' = the shortest K the goal applies to")
    ap.add_argument("--interval-factor", type=float, default=2.5, help="auto: K x step >= this x the slowest save")
    ap.add_argument("--calib-saves", type=int, default=2, help="timed saves per method that size K for auto")
    ap.add_argument("--min-interval", type=int, default=20, help="auto: at least this many steps")
    ap.add_argument("--methods", default="carina-process")
    ap.add_argument("--pairs", type=int, default=12, help="at most this many checkpointed blocks per interval")
    ap.add_argument("--min-pairs", type=int, default=3, help="at least this many, whatever the budget")
    ap.add_argument("--budget-s", type=float, default=0, help="shared out over the (method, interval) runs")
    ap.add_argument("--save-deadline-s", type=float, default=60)
    ap.add_argument("--warm-saves", type=int, default=2, help="untimed saves per method first (2: both arenas)")
    ap.add_argument("--dir", default=None, help="checkpoint disk (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-paired-"))
    root.mkdir(parents=True, exist_ok=True)
    model, opt, _x, step, nbytes, bw, src = warm_workload(args.params, args.device, args.model, root)
    calib = [step() for _ in range(20)]
    step_s = sum(calib) / len(calib)
    run: dict[str, Any] = {"params": n_params(model), "state_bytes": nbytes, "disk_write_Bps": bw,
                           "disk_ceiling_source": src, "persist_s": nbytes / bw, "calibration_step_s": step_s,
                           "setup_s": time.perf_counter() - t_start, "methods": {}}  # fmt: skip
    write(args, run)
    names = [m for m in args.methods.split(",") if m]
    counter = [0]
    for j, name in enumerate(names):
        res: dict[str, Any] = {"intervals": {}}
        run["methods"][name] = res
        sub = root / name.replace(".", "_")
        sub.mkdir(parents=True, exist_ok=True)
        try:
            with PeakMemory() as mem:
                run_method(name, sub, (model, opt, step), args, run, counter, t_start, len(names) - j)
            res.update(mem.result())
        except Exception as exc:  # a method that cannot run here: record it, go on
            res["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            print(name, "failed:", exc, file=sys.stderr, flush=True)
        shutil.rmtree(sub, ignore_errors=True)
        release_host_memory()
        write(args, run)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


def _blocks(raw: list[dict[str, Any]]) -> list[Block]:
    return [Block(steps_s=b["steps_s"], blocking_s=b.get("blocking_s", 0.0), in_flight=b.get("in_flight") or 0)
            for b in raw]  # fmt: skip


def summarize(name: str, out: dict[str, Any], persist_s: float) -> dict[str, Any]:
    """One row: the paired estimate, its intervals, the null estimate, the verdict."""
    k, ckpt, clean = out["interval"], _blocks(out["ckpt"]), _blocks(out["clean"][: len(out["ckpt"]) + 1])
    row: dict[str, Any] = {"method": name, "interval": k, "pairs": len(ckpt)}
    if len(ckpt) < 2:
        return {**row, "note": "fewer than 2 checkpointed blocks"}
    est = paired_overhead(ckpt, clean, k)
    interval_s = k * est.base_step_s
    durables = [b["durable_s"] for b in out["ckpt"]]
    persist = max(persist_s, statistics.median(durables))  # the ideal time, or the blocks' median save if longer
    applies = interval_s >= 2 * persist
    row.update({"interval_s": round(interval_s, 3), "persist_s": round(persist, 3),
                "persist_max_s": round(max(durables), 3),
                "interval_over_persist": round(interval_s / persist, 3), "overhead_pct": round(est.pct, 3),
                "ci95_pct": _r3(est.ci_pct), "bootstrap95_pct": _r3(est.bootstrap_pct),
                "per_block_pct": _r3(est.per_block_pct), "in_flight_pct": round(est.in_flight_pct, 3),
                "in_flight_ci95_pct": _r3(est.in_flight_ci_pct),
                "after_durable_pct": round(est.after_pct, 3), "blocking_pct": round(est.blocking_pct, 3),
                "in_flight_step_pct": round(est.in_flight_step_pct, 3),
                "after_step_pct": round(est.after_step_pct, 3),
                "flight_minus_after_step_pct": round(est.flight_minus_after_step_pct, 3),
                "flight_minus_after_ci95_pct": _r3(est.flight_minus_after_ci_pct),
                "blocking_s_per_save": round(sum(b["blocking_s"] for b in out["ckpt"]) / len(ckpt), 4),
                "durable_s": [round(b["durable_s"], 3) for b in out["ckpt"]],
                "extended_blocks": sum(len(b["steps_s"]) > k for b in out["ckpt"]), "goal_applies": applies,
                "verdict": verdict(est.ci_pct, GOAL_PCT, applies),
                "verdict_in_flight": verdict(est.in_flight_ci_pct, GOAL_PCT, applies)})  # fmt: skip
    if len(clean) >= 4:
        null = null_overhead(clean, k)
        row.update({"null_pct": round(null.pct, 3), "null_ci95_pct": _r3(null.ci_pct)})
    return row


def _r3(values: Any) -> list[float]:
    return [round(v, 3) for v in values]


def write(args: Any, run: dict[str, Any]) -> None:
    summary = []
    for name, res in run["methods"].items():
        for out in res["intervals"].values():
            summary.append(summarize(name, out, run["persist_s"]))
        if "error" in res:
            summary.append({"method": name, "note": res["error"][:300]})
    measured = [r for r in summary if "overhead_pct" in r]
    figures = []
    for r in measured:
        if r["method"].startswith("carina-"):
            peers = {p["method"]: p["overhead_pct"] for p in measured
                     if p["interval"] == r["interval"] and not p["method"].startswith("carina-")}  # fmt: skip
            ceiling = (f"none (0 %); goal <= {GOAL_PCT} % when the interval is >= 2x the persist time "
                       f"{r['persist_s']:.2f} s; 95 % interval {r['ci95_pct']}")  # fmt: skip
            figures.append(Figure(name=f"overhead_{r['method'].removeprefix('carina-')}_k{r['interval']}",
                                  value=r["overhead_pct"], unit="%", higher_is_better=False, peers=peers,
                                  ceiling_source=ceiling))  # fmt: skip
    keys = ("params", "model", "device", "intervals", "interval_factor", "calib_saves", "min_interval", "methods",
            "pairs", "min_pairs", "budget_s", "threads", "warm_saves")  # fmt: skip
    cfg = {k: getattr(args, k) for k in keys}
    notes = (f"{args.model} {size_label(args.params)} ({run['params'] / 1e6:.1f}M params, "
             f"{run['state_bytes'] / 1e9:.2f} GB state) on {args.device}; interleaved blocks of K steps in one "
             "process (clean, ckpt, clean, ...), each checkpointed block (one save, K steps or more until durable) "
             "against the mean step of the clean blocks before and after it; overhead = excess / (K x base step), "
             "mean over blocks with a 95 % Student-t interval (and a seeded bootstrap); null = the inner clean "
             "blocks against their neighbours; verdict met / missed / unresolved from the t interval against "
             f"{GOAL_PCT} %, n/a when K x step < 2 x persist_s (the ideal bytes / disk bw, or the blocks' median save "
             f"if longer; persist_max_s the slowest); auto K: K x step >= {args.interval_factor} x the slowest of "
             f"{args.calib_saves} timed calibration saves (metrics.methods.<m>.calibration); verdict_in_flight "
             "the same from blocking + the in-flight steps only (less noisy; it assumes steps after durable cost "
             "nothing: after_durable_pct); blocking_pct = the blocking part of in_flight_pct; in_flight_step_pct / "
             "after_step_pct = how much slower than the base an in-flight / after-durable step ran (mean over "
             "blocks, % of a step), flight_minus_after_step_pct their per-block difference with its t interval. "
             "Every step time is in metrics.methods.")  # fmt: skip
    name = args.name or f"ckpt_overhead_paired_{args.device}"
    rec = make_record(name=name, figures=figures, config=cfg, metrics={"summary": summary, **run}, notes=notes,
                      environment=env())  # fmt: skip
    path = write_record(rec)
    if measured:
        print(path, measured[-1], file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
