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
- ``stall_s`` = blocking + interference, ``durable_s`` from save to its commit marker;
- ``bytes_written`` (the files of the timed save as they lie on disk), ``durable_bound_s`` =
  1.2 x bytes_written / disk bw + 0.5 s (issue 7's goal) and ``within_bound``.

With ``--probe-same``, a warm method's untimed save is followed by a disk probe of its size in its folder
(write_probe.py: written like a carina writer writes, fsynced, deleted), then one more training step, then
the timed save: each row gets the bound from that same-size write (``durable_bound_same_s``,
``within_bound_same``) and, for carina writers, where the save's time went by its writer's timeline
(``write_GBps``, the waits, ``limit``); ``metrics.writes`` keeps both timelines and their rates per 4 GiB.
The peers delete their previous save once the new one is durable, outside every timing (as carina's
writers do after their commit; up to session 10 the peers deleted it inside their timed save).

The disk bw is probed in the checkpoint directory in the same run, as bench_fork_write.py
does without fio (``write_probe.write_passes``: an untimed pass, then 3 timed passes of
``--probe-mb`` O_DIRECT writes, each fsynced): once before the model is built, once after
the last method; ``metrics.disk_probe`` keeps every pass, the bound uses the best of all.

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

from ckpt_methods import make_method, saved_bytes
from ckpt_workload import PeakMemory
from offload_fit import fit_model
from stall_record import env
from write_probe import same_size_probe, window_rates, write_passes, writer_row

from carina.core.bench import Figure, make_record, write_record


def bound_row(durable_s: float | None, nbytes: int, bw: float | None) -> dict[str, Any]:
    """A summary row's goal fields: the bytes, the bound 1.2 x bytes / bw + 0.5 s, whether durable_s is within it."""
    if not bw:
        return {"bytes_written": nbytes, "durable_bound_s": None, "within_bound": None}
    bound = 1.2 * nbytes / bw + 0.5
    return {"bytes_written": nbytes, "durable_bound_s": round(bound, 4),
            "within_bound": None if durable_s is None else durable_s <= bound}  # fmt: skip


def probe_metrics(passes: dict[str, list[float]], size: int) -> dict[str, Any]:
    """``metrics.disk_probe``: each probe's pass rates (GB/s) and the best pass of all (B/s)."""
    rates = [r for each in passes.values() for r in each]
    return {"size_bytes": size, **{f"{k}_GBps": [round(r / 1e9, 3) for r in v] for k, v in passes.items()},
            "best_Bps": max(rates) if rates else None}  # fmt: skip


class Finished(Exception):
    """Every method is measured: leave the training loop."""


class Driver:
    """Cycles the methods through warm-up save, timed save, clean steps (as ``after_step``)."""

    def __init__(self, methods: list[str], root: Path, warmup: int, settle: int, deadline_s: float,
                 cold: tuple[str, ...] = (), budget_s: float = 0, on_close: Any = None,
                 probe_same: bool = False) -> None:  # fmt: skip
        self.todo, self.root, self.warmup, self.settle = list(methods), root, warmup, settle
        self.deadline_s, self.cold, self.budget_s, self.on_close = deadline_s, cold, budget_s, on_close
        self.probe_same, self.probed = probe_same, None
        self.t_mono = 0.0
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
            if self.probe_same and self.probed is None and self.method.name not in self.cold:
                self.probed = same_size_probe(self.root / self.method.name, saved_bytes(self.method.saved(0)))
                return  # one training step between the probe's deletion and the timed save
            self.phase, self.t_save, self.t_mono = "timed", time.time(), time.monotonic()
            tb = time.perf_counter()
            self.method.start(done)
            self.results[self.method.name] = {"blocking_s": time.perf_counter() - tb, "step": done}
            if self.probed is not None:
                self.results[self.method.name]["same_size"], self.probed = self.probed, None
            if self.method.done():  # a synchronous method: durable when save returns
                self.results[self.method.name]["durable_s"] = time.time() - self.t_save
                self.results[self.method.name]["bytes_written"] = saved_bytes(self.method.saved(done))
                self.phase, self.left = "clean", self.settle
        elif self.phase == "timed":
            res = self.results[self.method.name]
            if self.method.done():
                marker = self.method.durable_at()
                res["durable_s"] = (marker if marker is not None else time.time()) - self.t_save
                res["bytes_written"] = saved_bytes(self.method.saved(res["step"]))
                if hasattr(self.method, "ckpt"):  # lent host state: slots copied behind training, by a guard first
                    res["lent_slots"], res["guard_copied_slots"] = self.method.ckpt.lent_copies()
                    self._timeline(res)
                self.method.retire()  # the previous save, outside every timing
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
        self.method.prune_in_start = False
        if name not in self.cold:
            self.method.start(0)  # untimed: arenas, the writer process
        self.phase = "warm"

    def _timeline(self, res: dict[str, Any]) -> None:
        """The carina writer's timeline of the timed save (None for fork), and when it took the job."""
        tl = self.method.ckpt.write_timeline(res["step"])
        if tl is not None:
            res["timeline"], res["received_s"] = tl, tl["t0"] - self.t_mono

    def _close(self) -> None:
        name = self.method.name
        self.method.close()
        self.mem.__exit__(None, None, None)
        self.results[name].update(self.mem.result())
        shutil.rmtree(self.root / name, ignore_errors=True)
        self.method = None
        if self.on_close is not None:
            self.on_close()

    def summary(self, bw: float | None = None) -> list[dict[str, Any]]:
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
            if "bytes_written" in res:
                row.update(bound_row(res.get("durable_s"), res["bytes_written"], bw))
                row.update(writer_row(res.get("durable_s"), res["bytes_written"], res.get("timeline"),
                                      res.get("received_s"), res.get("same_size")))  # fmt: skip
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
    ap.add_argument("--probe-mb", type=int, default=4096,
                    help="disk probe: MiB per timed pass, a multiple of 64 (0: no probe, no bound)")  # fmt: skip
    ap.add_argument("--probe-same", action="store_true",
                    help="before each warm method's timed save, probe the disk with a write of its size")  # fmt: skip
    args = ap.parse_args()
    if args.probe_mb < 0 or args.probe_mb % 64:
        raise SystemExit(f"--probe-mb {args.probe_mb}: a multiple of 64 (its writes are 64 MiB each), or 0")
    t0 = time.perf_counter()
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-offload-"))
    root.mkdir(parents=True, exist_ok=True)
    args.probe = {}
    probe(args, root, "before")
    methods = [m for m in args.methods.split(",") if m]
    cold = tuple(m for m in args.cold.split(",") if m)
    model, args.fit = args.model, None
    if args.layers:
        model, fit = fit_model(args.model, args.layers, methods, cold, root)
        args.fit = fit.summary()
        print("shape:", args.fit, file=sys.stderr, flush=True)
    driver = Driver(methods, root, args.warmup, args.settle, args.deadline_s, cold, args.budget_s,
                    on_close=lambda: write(args, driver, time.perf_counter() - t0),
                    probe_same=args.probe_same)  # fmt: skip
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
    probe(args, root, "after")
    write(args, driver, time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)


def probe(args: Any, root: Path, when: str) -> None:
    """Probe the checkpoint disk (``--probe-mb`` per pass) into ``args.probe[when]``."""
    if args.probe_mb:
        args.probe[when] = write_passes(root, args.probe_mb << 20)
        print(f"disk probe {when}:", [round(r / 1e9, 3) for r in args.probe[when]], "GB/s", file=sys.stderr, flush=True)


def writes(driver: Driver, window: int = 4 << 30) -> list[dict[str, Any]]:
    """``metrics.writes``: per method with a same-size probe or a writer timeline, both kept, and each one's
    rate (GB/s) over every ``window`` bytes written (the probe's ``written`` stream, the writer's)."""
    out = []
    for name, res in driver.results.items():
        probe, tl = res.get("same_size"), res.get("timeline")
        if probe is None and tl is None:
            continue
        out.append({"method": name, "window_GiB": window >> 30,
                    "probe_GBps_by_window": _rates(probe["timeline"] if probe else None, window),
                    "writer_GBps_by_window": _rates(tl, window), "same_size_probe": probe, "timeline": tl})  # fmt: skip
    return out


def _rates(timeline: dict[str, Any] | None, window: int) -> list[float] | None:
    """GB/s over each ``window`` bytes of a timeline's ``written`` stream (None without one)."""
    written = timeline["streams"].get("written") if timeline else None
    return window_rates(written, window) if written else None


def write(args: Any, driver: Driver, wall_s: float) -> None:
    disk = probe_metrics(args.probe, args.probe_mb << 20)
    bw = disk["best_Bps"]
    rows = driver.summary(bw)
    params = sum(p.numel() for p in driver.model.parameters())
    state = 3 * 4 * params  # fp32 masters + two AdamW moments
    peers = {r["method"]: r["stall_s"] for r in rows if not r["method"].startswith("carina-") and "stall_s" in r}
    figures = []
    for r in rows:
        if r["method"].startswith("carina-") and r.get("stall_s", 0) > 0:
            figures.append(Figure(name=f"stall_{r['method']}", value=r["stall_s"], unit="s", higher_is_better=False,
                                  peers=peers, ceiling_source="none (0 s)"))  # fmt: skip
    durable = {r["method"]: r["durable_s"] for r in rows if r.get("durable_s")}
    for r in rows:
        rate, source = (r["same_size_GBps"] * 1e9, "same-size probe") if "same_size_GBps" in r else (bw, "best pass")
        if rate and r["method"].startswith("carina-") and r.get("durable_s"):
            figures.append(Figure(name=f"time_to_durable_{r['method'].removeprefix('carina-')}", value=r["durable_s"],
                                  unit="s", higher_is_better=False, ceiling=round(r["bytes_written"] / rate, 4),
                                  ceiling_source=f"bytes written / disk probe, {source} ({rate / 1e9:.3f} GB/s)",
                                  peers={p: v for p, v in durable.items() if p != r["method"]}))  # fmt: skip
    clean = [s for s, label in driver.steps if label == "clean"]
    metrics = {"summary": rows, "params": params, "state_bytes": state, "step_s_median": statistics.median(clean)
               if clean else None, "steps": driver.steps, "wall_s": wall_s, "shape": args.fit,
               "disk_probe": disk, "disk_write_Bps": bw, "writes": writes(driver)}  # fmt: skip
    cfg = {k: getattr(args, k) for k in ("model", "device", "budget", "micro_batch", "seq_len", "methods", "warmup",
                                          "layers", "cold", "budget_s", "probe_mb", "probe_same")}  # fmt: skip
    shape = args.model if args.fit is None else f"{args.model} shape at {args.fit['layers']} layers"
    notes = (f"carina.offload run ({shape}, {params / 1e9:.2f}B params, device budget {args.budget}, "
             f"{args.micro_batch}x{args.seq_len} tokens per step) checkpointed by each method in turn in one "
             f"process: one untimed save (none for: {args.cold or '-'}), one timed save; stall = blocking + the "
             "overlapped steps' time beyond the median clean step; bytes_written = the files of the timed save as "
             "they lie on disk (the state's tensors, metrics.state_bytes, plus each format's headers and "
             "metadata); durable_bound_s = 1.2 x bytes_written / disk bw + 0.5 s, disk bw = the best pass of "
             "the disk probes in the checkpoint directory (metrics.disk_probe: carina.io O_DIRECT writes of "
             f"{args.probe_mb} MiB each fsynced, an untimed 64 MiB pass then 3 timed ones, before the model is "
             "built and again after the last method; the bound uses the best pass of both). The peers delete "
             "their previous save once the new one is durable, outside every timing.")  # fmt: skip
    if args.probe_same:
        notes += (
            " Same-size probe (write_probe.py): after each warm method's untimed save, its bytes written "
            "again as one new file in its folder (carina.io, O_DIRECT, 64 MiB requests of random bytes, "
            "fsynced, then deleted), one training step, then the timed save; durable_bound_same_s = 1.2 x "
            "bytes_written / that probe's rate + 0.5 s; limit = what held the writer's write phase back "
            "(write_probe.attribute); metrics.writes keeps the probe's and the writer's timelines."
        )
    name = args.name or f"ckpt_offload_{args.device}"
    rec = make_record(name=name, figures=figures, config=cfg, metrics=metrics, notes=notes, environment=env())
    print(write_record(rec), file=sys.stderr, flush=True)
    for r in rows:
        print(r, file=sys.stderr)


if __name__ == "__main__":
    main()
