"""Training stall per checkpoint: carina writers vs torch.save vs torch.distributed.checkpoint.

One run trains a model with AdamW (an MLP stack, or a random-init transformers
Llama: ckpt_workload.py) and checkpoints it repeatedly with each method. Per
checkpoint it measures the blocking time B (the save call), the interference I
(sum over the steps taken while the save is in flight of step - median clean
step), stall = B + I, and the time until durable D. The disk ceiling is a
sequential O_DIRECT write measured in the same run (fio when present); the peak
host memory of the trainer and its writer children is sampled per method.
``--params`` may list several sizes (one after the other, in one record);
``--append`` adds them to an existing record of the same name, keeping its
other sizes. Writes one record through carina.core.bench (stall_record.py),
after the setup of each size and after every method.

    python benchmarks/ckpt/bench_stall.py --params 20e6 --reps 5            # CPU
    python benchmarks/ckpt/bench_stall.py --model llama --params 125e6 --device cuda --reps 4
    python benchmarks/ckpt/bench_stall.py --model llama --params 350e6,1.3e9 --device cuda --append \
        --writers thread --peers torch.save,dcp.async_save
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch
from ckpt_methods import make_method
from ckpt_workload import (
    ForkTimer,
    PeakMemory,
    build,
    make_step,
    n_params,
    proc_state,
    release_host_memory,
    state_bytes,
)
from write_probe import write_passes


# -- measurement ------------------------------------------------------------------
class SaveTimeout(RuntimeError):
    """A save was not durable within the per-save deadline."""


def measure(
    method: Any, step: Any, reps: int, min_steps: int, step_no: int, deadline_s: float = 0, forks: Any = None
) -> list[dict[str, float]]:
    """Per save: B, I against the median of the clean steps just before it (load drifts), D.

    Each save is logged (stderr) as it ends; one not durable within ``deadline_s`` raises SaveTimeout
    naming what the writer process is doing. ``forks`` (a ForkTimer) adds the parent's time in fork().
    """
    out = []
    for rep in range(reps):
        base = statistics.median(step() for _ in range(min_steps))
        wall0, t0 = time.time(), time.perf_counter()
        method.start(step_no + rep)
        blocking = time.perf_counter() - t0
        extra, n = 0.0, 0
        while not method.done():
            extra += step() - base
            n += 1
            if deadline_s and time.perf_counter() - t0 > deadline_s:
                raise SaveTimeout(f"save {rep + 1} of {method.name} not durable after {deadline_s:g} s ({n} steps);"
                                  f" writer {writer_state(method)}; {forks.since(t0) if forks else ''}")  # fmt: skip
        marker = method.durable_at()
        durable = marker - wall0 if marker is not None else time.perf_counter() - t0
        row = {"blocking_s": blocking, "interference_s": extra, "stall_s": blocking + extra, "durable_s": durable,
               "steps_in_flight": n, "base_step_s": base, **(forks.since(t0) if forks else {})}  # fmt: skip
        out.append(row)
        print(f"  {method.name} save {rep + 1}: blocking {blocking:.4f} s, stall {blocking + extra:.4f} s, "
              f"durable {durable:.3f} s, {n} steps in flight {forks.since(t0) if forks else ''}",
              file=sys.stderr, flush=True)  # fmt: skip
    method.close()
    return out


def _writer(method: Any) -> Any:
    return getattr(getattr(method, "ckpt", None), "_writer", None)  # benchmark-only look at a private field


def writer_state(method: Any) -> dict[str, str]:
    """/proc view of a carina fork child or process writer (empty for other methods)."""
    writer = _writer(method)
    child, proc = getattr(writer, "_child", None), getattr(writer, "_proc", None)
    pid = child[0] if child else getattr(proc, "pid", None)
    return proc_state(pid) if pid else {}


def abandon(method: Any) -> None:
    """After a SaveTimeout: stop a forked writer child (ours) so it does not load the disk for later methods."""
    writer = _writer(method)
    child = getattr(writer, "_child", None)
    if child:
        try:
            os.kill(child[0], 9)
            os.waitpid(child[0], 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        writer._child = None  # its optimizer hook stays registered and polls the writer: nothing left to reap
        writer._pending.clear()
    proc = getattr(writer, "_proc", None)
    if proc is not None and proc.is_alive():
        proc.kill()


def warm_workload(params: float, device: str, model_kind: str, root: Path) -> tuple[Any, ...]:
    """Build the workload (seed 0), run 5 warm-up steps, size its state and measure the disk under ``root``.

    Returns ``(model, optimizer, batch, step, state_bytes, disk_write_Bps, disk_ceiling_source)``.
    """
    torch.manual_seed(0)
    model, opt, x = build(params, device, model_kind)
    step = make_step(model, opt, x, device)
    for _ in range(5):
        step()
    nbytes = state_bytes(model, opt)
    bw, src = disk_ceiling(root, nbytes)
    return model, opt, x, step, nbytes, bw, src


def disk_ceiling(root: Path, nbytes: int, passes: int = 3) -> tuple[float, str]:
    """Sequential O_DIRECT write bandwidth (B/s) of the checkpoint disk, with fsync.

    Without fio: an untimed pass first (the first carina.io engine of a process pays tens of ms of imports
    and probes, which session 8's single timed pass counted), then the best of ``passes`` timed ones, each
    named in the source: a writer measured above a one-pass ceiling (carina-process at 1.019 in
    ``ckpt_fork_write_h200_s8``) showed the ceiling too low, not the writer beyond the disk.
    """
    size = max(256 << 20, min(nbytes, 2 << 30)) >> 20 << 20
    target = root / "fio.bin"
    if shutil.which("fio"):
        cmd = ["fio", "--name=ceiling", f"--filename={target}", "--rw=write", "--bs=4M", f"--size={size}",
               "--direct=1", "--ioengine=libaio", "--iodepth=16", "--end_fsync=1", "--output-format=json"]  # fmt: skip
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        target.unlink(missing_ok=True)
        return float(res["jobs"][0]["write"]["bw_bytes"]), f"fio seq write 4M qd16 O_DIRECT {size >> 20} MiB"
    rates = write_passes(root, size, passes)
    each = ", ".join(f"{r / 1e9:.3f}" for r in rates)
    return max(rates), f"carina.io seq write O_DIRECT {size >> 20} MiB, best of {passes} ({each} GB/s) (fio absent)"


def sync_copy_s(model: Any, opt: Any, limit: int = 4 << 30) -> float | None:
    """A blocking copy of the whole state into host memory (what a synchronous snapshot costs).

    None above ``limit`` bytes: pinning that much (torch rounds each buffer up to a power of two) would
    cost the run seconds for a side figure.
    """
    tensors = list(model.state_dict().values())
    for s in opt.state_dict()["state"].values():
        tensors += [v for v in s.values() if torch.is_tensor(v)]
    if sum(t.numel() * t.element_size() for t in tensors) > limit:
        return None
    dst = [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for t in tensors]
    t0 = time.perf_counter()
    for d, t in zip(dst, tensors, strict=True):
        d.copy_(t)
    return time.perf_counter() - t0


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    later = rows[1:] or rows
    keys = ("blocking_s", "interference_s", "stall_s", "durable_s")
    out = {f"{k}_median": statistics.median(r[k] for r in later) for k in keys}
    out["stall_s_max"] = max(r["stall_s"] for r in later)
    out["first_stall_s"] = rows[0]["stall_s"]
    return out


def size_label(params: float) -> str:
    """125M, 350M, 1.3B."""
    return f"{params / 1e9:.2g}B" if params >= 1e9 else f"{params / 1e6:.3g}M"


def estimate_s(prev: dict[str, Any] | None, params: float, names: list[str], reps: int) -> dict[str, float]:
    """Seconds each of ``names`` should take at ``params``: an earlier size's per save, scaled by size and reps.

    ``setup`` is the earlier size's setup time, unscaled (imports and CUDA start dominate it).
    """
    if not prev or "setup_s" not in prev:
        return {}
    scale = params / prev["params"]
    per_save = {k: v["wall_s"] / len(v["reps"]) for k, v in prev["methods"].items() if "wall_s" in v}
    fallback = max(per_save.values(), default=0.0)
    return {"setup": prev["setup_s"], **{n: per_save.get(n, fallback) * reps * scale for n in names}}


def run_methods(args: Any, names: list[str], model: Any, opt: Any, step: Any, root: Path, run: dict[str, Any],
                save: Any, t_start: float, est: dict[str, float]) -> None:  # fmt: skip
    """Measure every method on one model into ``run["methods"]``, calling ``save()`` after each.

    A method is skipped when ``--budget-s`` would be passed before it ends (``est``: its expected seconds).
    """
    results = run["methods"]
    for i, name in enumerate(names):
        if args.budget_s and time.perf_counter() - t_start + est.get(name, 0) > args.budget_s:
            results[name] = {"skipped": f"time budget (expected {est.get(name, 0):.0f} s)"}
            continue
        sub = root / name
        sub.mkdir(exist_ok=True)
        t_method = time.perf_counter()
        m: Any = None
        with ForkTimer() as forks, PeakMemory() as mem:
            try:
                m = make_method(name, sub, model, opt)
                rows = measure(m, step, args.reps, args.min_steps, 1000 * (i + 1), args.save_deadline_s, forks)
            except Exception as exc:  # e.g. /dev/shm too small for the process writer: record it, go on
                if isinstance(exc, SaveTimeout):
                    abandon(m)
                rows = []
                results[name] = {"error": str(exc)[:2000]}
                print(name, "failed:", exc, file=sys.stderr, flush=True)
        shutil.rmtree(sub, ignore_errors=True)
        if rows:
            results[name] = {**summarize(rows), **mem.result(), "wall_s": time.perf_counter() - t_method, "reps": rows}
            print(name, json.dumps({k: round(v, 4) for k, v in results[name].items() if k != "reps"}),
                  f"({time.perf_counter() - t_method:.1f} s)", file=sys.stderr, flush=True)  # fmt: skip
        save()  # after every method: a kill loses little


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="20e6", help="parameter counts, comma-separated (one run each, in order)")
    ap.add_argument("--model", default="mlp", choices=("mlp", "llama"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--writers", default="fork,process,thread")
    ap.add_argument("--peers", default="torch.save,dcp.save,dcp.async_save")
    ap.add_argument("--dir", default=None, help="checkpoint disk (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default=None)
    ap.add_argument("--append", action="store_true", help="keep the other sizes of an existing record --name")
    ap.add_argument("--budget-s", type=float, default=0, help="skip methods once this much time has passed")
    ap.add_argument("--save-deadline-s", type=float, default=0, help="give up a method whose save takes longer")
    args = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    from stall_record import StallRecord

    record = StallRecord(args)
    ours = [f"carina-{w}" for w in args.writers.split(",") if w]
    theirs = [p for p in args.peers.split(",") if p]
    # Alternate carina writers and peers, so a --budget-s cut leaves both sides measured.
    names = [m for pair in zip_longest(ours, theirs) for m in pair if m]
    for params in (float(p) for p in args.params.split(",") if p):
        t_size = time.perf_counter()
        prev = next((r for r in reversed(record.sizes.values()) if "setup_s" in r), None)
        est = estimate_s(prev, params, names, args.reps)
        need = est.get("setup", 0) + est.get(names[0], 0)  # its setup and first method
        if args.budget_s and t_size - t_start + need > args.budget_s:
            record.add(size_label(params), {"params": params, "skipped": f"time budget (expected {need:.0f} s)"})
            continue
        model, opt, x, step, nbytes, bw, src = warm_workload(params, args.device, args.model, root)
        run: dict[str, Any] = {"params": n_params(model), "state_bytes": nbytes, "disk_write_Bps": bw,
                               "step_s_median": statistics.median(step() for _ in range(10)), "methods": {},
                               "disk_ceiling_source": src, "sync_copy_s": sync_copy_s(model, opt)}  # fmt: skip
        print(f"{size_label(params)}: {run['params'] / 1e6:.1f}M params, state {nbytes / 1e9:.3f} GB, step "
              f"{run['step_s_median'] * 1e3:.1f} ms, disk {bw / 1e9:.2f} GB/s, "
              f"at {time.perf_counter() - t_start:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
        run["setup_s"] = time.perf_counter() - t_size
        record.add(size_label(params), run)  # the setup figures, before any method
        run_methods(args, names, model, opt, step, root, run, record.write, t_start, est)
        del model, opt, x, step
        release_host_memory()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
