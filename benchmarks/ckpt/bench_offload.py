"""Checkpoint stall of a carina.offload training run: carina writers vs torch.save, one process.

carina.offload keeps the fp32 masters and AdamW state in host memory, so a
checkpoint is a host-to-host snapshot of the whole optimizer state while the GPU
keeps training. One run of :func:`carina.offload.job.run` builds the model once;
after its warm-up steps each method in turn makes one untimed save (arenas,
writer process), then one timed save; training goes on until that save is durable,
then a few clean steps, then the next method. Per method:

- ``blocking_s``: time inside ``save`` (or ``torch.save`` + fsync);
- ``interference_s``: what the steps run while the save was in flight took beyond
  the median clean step (clean: no save in flight);
- ``stall_s`` = blocking + interference, ``durable_s`` from save to its commit marker.

    python benchmarks/ckpt/bench_offload.py --model tiny --device cpu --budget 64MiB
    python benchmarks/ckpt/bench_offload.py --model llama-1b --device cuda --budget 8GiB \\
        --micro-batch 4 --seq-len 2048 --name ckpt_offload_h200
    python benchmarks/ckpt/bench_offload.py --model llama2-7b --layers 8 --device cuda --budget 24GiB \\
        --micro-batch 4 --seq-len 2048 --cold torch.save --budget-s 180 --name ckpt_offload7b_h200

``--layers N`` trains the preset's shape with at most N of its layers: fewer when
the host RAM, the checkpoint disk or /dev/shm free at the start cannot hold what
the run needs (offload_fit.py; the record keeps the estimate and the free space).
``--cold`` names methods whose first save is the timed one (a synchronous peer has
nothing to warm); ``--budget-s`` starts no method after that many seconds. The
record is rewritten after every method.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ckpt_methods import make_method
from ckpt_workload import PeakMemory
from offload_fit import fit_model
from stall_record import env

from carina.core.bench import Figure, make_record, write_record


class Finished(Exception):
    """Every method is measured: leave the training loop."""


class Driver:
    """Cycles the methods through warm-up save, timed save, clean steps (as ``after_step``)."""

    def __init__(self, methods: list[str], root: Path, warmup: int, settle: int, deadline_s: float,
                 cold: tuple[str, ...] = (), budget_s: float = 0, on_close: Any = None) -> None:  # fmt: skip
        self.todo, self.root, self.warmup, self.settle = list(methods), root, warmup, settle
        self.deadline_s, self.cold, self.budget_s, self.on_close = deadline_s, cold, budget_s, on_close
        self.t0 = time.perf_counter()
        self.skipped: list[str] = []
        self.model: Any = None
        self.opt: Any = None
        self.method: Any = None
        self.phase = "clean"
        self.left = 0
        self.t_save = 0.0
        self.results: dict[str, dict[str, Any]] = {}
        self.steps: list[tuple[float, str]] = []  # (seconds, "clean" | method name while its save is in flight)
        self.mem: Any = None

    def bind(self, model: Any, opt: Any) -> int:
        self.model, self.opt = model, opt
        return 0

    def on_step(self, rep: Any) -> None:
        label = self.method.name if self.phase == "timed" else ("warm" if self.phase == "warm" else "clean")
        self.steps.append((rep.seconds, label if rep.step >= self.warmup else "warmup"))

    def after_step(self, done: int) -> None:
        if done < self.warmup:
            return
        if self.method is None:
            self._next()
        elif self.phase == "warm" and self.method.done():
            self.phase, self.t_save = "timed", time.time()
            tb = time.perf_counter()
            self.method.start(done)
            self.results[self.method.name] = {"blocking_s": time.perf_counter() - tb, "step": done}
            if self.method.done():  # a synchronous method: durable when save returns
                self.results[self.method.name]["durable_s"] = time.time() - self.t_save
                self.phase, self.left = "clean", self.settle
        elif self.phase == "timed":
            res = self.results[self.method.name]
            if self.method.done():
                marker = self.method.durable_at()
                res["durable_s"] = (marker if marker is not None else time.time()) - self.t_save
                if hasattr(self.method, "ckpt"):  # lent host state: slots copied behind training, by a guard first
                    res["lent_slots"], res["guard_copied_slots"] = self.method.ckpt.lent_copies()
                self.phase, self.left = "clean", self.settle
            elif time.time() - self.t_save > self.deadline_s:
                res["error"] = f"not durable after {self.deadline_s:.0f} s"
                self.phase, self.left = "clean", self.settle
        elif self.phase == "clean":
            self.left -= 1
            if self.left <= 0:
                self._close()
                self._next()

    def _next(self) -> None:
        if self.todo and self.budget_s and time.perf_counter() - self.t0 > self.budget_s:
            self.skipped, self.todo = self.todo, []
        if not self.todo:
            raise Finished
        name = self.todo.pop(0)
        sub = self.root / name
        sub.mkdir(parents=True, exist_ok=True)
        self.mem = PeakMemory().__enter__()
        self.method = make_method(name, sub, self.model, self.opt)
        if name not in self.cold:
            self.method.start(0)  # untimed: arenas, the writer process
        self.phase = "warm"

    def _close(self) -> None:
        name = self.method.name
        self.method.close()
        self.mem.__exit__(None, None, None)
        self.results[name].update(self.mem.result())
        shutil.rmtree(self.root / name, ignore_errors=True)
        self.method = None
        if self.on_close is not None:
            self.on_close()

    def summary(self) -> list[dict[str, Any]]:
        clean = [s for s, label in self.steps if label == "clean"]
        base = statistics.median(clean) if clean else 0.0
        rows = []
        for name, res in self.results.items():
            overlapped = [s for s, label in self.steps if label == name]
            interference = max(0.0, sum(overlapped) - base * len(overlapped))
            row = {"method": name, "blocking_s": round(res["blocking_s"], 4), "overlapped_steps": len(overlapped),
                   "interference_s": round(interference, 4), "stall_s": round(res["blocking_s"] + interference, 4),
                   "durable_s": round(res["durable_s"], 3) if "durable_s" in res else None,
                   "host_extra_GB": round(res.get("host_extra_GB", 0.0), 2)}  # fmt: skip
            row.update({k: res[k] for k in ("lent_slots", "guard_copied_slots") if k in res})
            row["warm_save"] = name not in self.cold
            if "error" in res:
                row["error"] = res["error"]
            rows.append(row)
        rows += [{"method": name, "note": "skipped: time budget"} for name in self.skipped]
        return rows


def main() -> None:
    from carina.memory.tiers import parse_bytes
    from carina.offload.config import OffloadConfig
    from carina.offload.job import TrainConfig, run

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", default="64MiB", help="device budget")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--methods", default="carina-process,carina-thread,carina-fork,torch.save")
    ap.add_argument("--warmup", type=int, default=4, help="steps before the first save (profiling included)")
    ap.add_argument("--settle", type=int, default=3, help="clean steps after each durable save")
    ap.add_argument("--deadline-s", type=float, default=60.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--layers", type=int, default=0, help="at most this many of the preset's layers (0: all)")
    ap.add_argument("--cold", default="", help="methods whose first save is the timed one (comma list)")
    ap.add_argument("--budget-s", type=float, default=0, help="start no method after this many seconds")
    args = ap.parse_args()
    t0 = time.perf_counter()
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-offload-"))
    methods = [m for m in args.methods.split(",") if m]
    cold = tuple(m for m in args.cold.split(",") if m)
    model, args.fit = args.model, None
    if args.layers:
        model, fit = fit_model(args.model, args.layers, methods, cold, root)
        args.fit = fit.summary()
        print("shape:", args.fit, file=sys.stderr, flush=True)
    driver = Driver(methods, root, args.warmup, args.settle, args.deadline_s, cold, args.budget_s,
                    on_close=lambda: write(args, driver, time.perf_counter() - t0))  # fmt: skip
    offload = OffloadConfig(device=args.device, device_budget=parse_bytes(args.budget))
    cfg = TrainConfig(model=model, steps=args.warmup + 400 * len(methods), micro_batch=args.micro_batch,
                      seq_len=args.seq_len, offload=offload)  # fmt: skip
    try:
        run(cfg, driver.on_step, resume=driver.bind, after_step=driver.after_step)
    except Finished:
        pass
    finally:
        if driver.method is not None:
            driver.method.close()
    write(args, driver, time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)


def write(args: Any, driver: Driver, wall_s: float) -> None:
    rows = driver.summary()
    params = sum(p.numel() for p in driver.model.parameters())
    state = 3 * 4 * params  # fp32 masters + two AdamW moments
    peers = {r["method"]: r["stall_s"] for r in rows if not r["method"].startswith("carina-") and "stall_s" in r}
    figures = []
    for r in rows:
        if r["method"].startswith("carina-") and r.get("stall_s", 0) > 0:
            figures.append(Figure(name=f"stall_{r['method']}", value=r["stall_s"], unit="s", higher_is_better=False,
                                  peers=peers, ceiling_source="none (0 s)"))  # fmt: skip
    clean = [s for s, label in driver.steps if label == "clean"]
    metrics = {"summary": rows, "params": params, "state_bytes": state, "step_s_median": statistics.median(clean)
               if clean else None, "steps": driver.steps, "wall_s": wall_s, "shape": args.fit}  # fmt: skip
    cfg = {k: getattr(args, k) for k in ("model", "device", "budget", "micro_batch", "seq_len", "methods", "warmup",
                                          "layers", "cold", "budget_s")}  # fmt: skip
    shape = args.model if args.fit is None else f"{args.model} shape at {args.fit['layers']} layers"
    notes = (f"carina.offload run ({shape}, {params / 1e9:.2f}B params, device budget {args.budget}, "
             f"{args.micro_batch}x{args.seq_len} tokens per step) checkpointed by each method in turn in one "
             f"process: one untimed save (none for: {args.cold or '-'}), one timed save; stall = blocking + the "
             "overlapped steps' time beyond the median clean step.")  # fmt: skip
    name = args.name or f"ckpt_offload_{args.device}"
    rec = make_record(name=name, figures=figures, config=cfg, metrics=metrics, notes=notes, environment=env())
    print(write_record(rec), file=sys.stderr, flush=True)
    for r in rows:
        print(r, file=sys.stderr)


if __name__ == "__main__":
    main()
