"""Training stall per checkpoint: carina writers vs torch.save vs torch.distributed.checkpoint.

One run trains an MLP stack with AdamW and checkpoints it repeatedly with each
method. Per checkpoint it measures the blocking time B (the save call), the
interference I (sum over the steps taken while the save is in flight of
step - median clean step), stall = B + I, and the time until durable D. The
disk ceiling is a sequential O_DIRECT write measured in the same run (fio when
present). Writes one record through carina.core.bench.

    python benchmarks/ckpt/bench_stall.py --params 20e6 --reps 5            # CPU
    python benchmarks/ckpt/bench_stall.py --params 1e9 --device cuda --reps 3
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

from carina.core.bench import Figure, make_record, write_record


# -- workload -------------------------------------------------------------------
def build(params: float, device: str) -> tuple[Any, Any, Any]:
    hidden = 1024 if device == "cpu" else 4096
    layers = max(2, round(params / (hidden * hidden)))
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden, device=device), torch.nn.GELU()]
    model = torch.nn.Sequential(*mods)
    fused = device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=fused)
    x = torch.randn(64 if device == "cpu" else 8192, hidden, device=device)
    return model, opt, x


def make_step(model: Any, opt: Any, x: Any, device: str) -> Any:
    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the host waits for the step, as a training loop logging its loss does
        return time.perf_counter() - t0

    return step


def state_bytes(model: Any, opt: Any) -> int:
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for s in opt.state_dict()["state"].values():
        n += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
    return n


# -- methods ----------------------------------------------------------------------
class TorchSave:
    name = "torch.save"

    def __init__(self, root: Path, model: Any, opt: Any) -> None:
        self.root, self.model, self.opt = root, model, opt

    def start(self, step: int) -> None:
        tmp, final = self.root / f"{step}.pt.tmp", self.root / f"{step}.pt"
        with open(tmp, "wb") as fh:
            torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        fd = os.open(self.root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        for old in self.root.glob("*.pt"):
            if old != final:
                old.unlink()

    def done(self) -> bool:
        return True

    def durable_at(self) -> float | None:
        """Wall-clock time the last save became durable, from its commit marker (None: when done() saw it)."""
        return None

    def close(self) -> None:
        return None


class DcpSave(TorchSave):
    name = "dcp.save"

    def _args(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint import FileSystemWriter

        path = self.root / f"dcp_{step}"
        self.last = path
        for old in self.root.glob("dcp_*"):
            shutil.rmtree(old)
        sd = {"model": self.model.state_dict(), "optim": self.opt.state_dict()}
        return sd, {"checkpoint_id": str(path), "storage_writer": FileSystemWriter(str(path), sync_files=True)}

    def start(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        sd, kw = self._args(step)
        dcp.save(sd, **kw)


class DcpAsync(DcpSave):
    name = "dcp.async_save"
    fut: Any = None

    def start(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        sd, kw = self._args(step)
        fut = dcp.async_save(sd, **kw)
        self.fut = getattr(fut, "upload_completion", fut)

    def done(self) -> bool:
        if self.fut is not None and self.fut.done():
            self.fut.result()  # surface errors
            return True
        return self.fut is None

    def durable_at(self) -> float | None:
        return (self.last / ".metadata").stat().st_mtime  # DCP's commit marker, renamed into place last

    def close(self) -> None:
        if self.fut is not None:
            self.fut.result()


class Carina:
    def __init__(self, root: Path, model: Any, opt: Any, writer: str) -> None:
        from carina.ckpt import Checkpointer, Config, WriterKind

        self.name = f"carina-{writer}"
        # Pin both staging arenas before training (params + two Adam moments, fp32), not inside the first save.
        state_bytes = 3 * sum(p.numel() * 4 for p in model.parameters()) + (64 << 20)
        self.ckpt = Checkpointer(Config(dir=str(root), writer=WriterKind(writer), keep_last=1, arena_bytes=state_bytes))
        self.state = {"model": model, "optim": opt}

    def start(self, step: int) -> None:
        self.ckpt.save(step, self.state)

    def done(self) -> bool:
        return not self.ckpt.in_flight()

    def durable_at(self) -> float:
        return (Path(self.ckpt.config.dir) / "latest").stat().st_mtime  # replaced last in the commit

    def close(self) -> None:
        self.ckpt.close()


# -- measurement ------------------------------------------------------------------
class SaveTimeout(RuntimeError):
    """A save was not durable within the per-save deadline."""


def measure(
    method: Any, step: Any, reps: int, min_steps: int, step_no: int, deadline_s: float = 0
) -> list[dict[str, float]]:
    """Per save: B, I against the median of the clean steps just before it (load drifts), D.

    Each save is logged (stderr) as it ends; one not durable within ``deadline_s`` raises SaveTimeout.
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
                raise SaveTimeout(f"save {rep + 1} of {method.name} not durable after {deadline_s:g} s ({n} steps)")
        marker = method.durable_at()
        durable = marker - wall0 if marker is not None else time.perf_counter() - t0
        out.append({"blocking_s": blocking, "interference_s": extra, "stall_s": blocking + extra,
                    "durable_s": durable, "steps_in_flight": n, "base_step_s": base})  # fmt: skip
        print(f"  {method.name} save {rep + 1}: blocking {blocking:.4f} s, stall {blocking + extra:.4f} s, "
              f"durable {durable:.3f} s, {n} steps in flight", file=sys.stderr, flush=True)  # fmt: skip
    method.close()
    return out


def abandon(method: Any) -> None:
    """After a SaveTimeout: stop a forked writer child (ours) so it does not load the disk for later methods."""
    writer = getattr(getattr(method, "ckpt", None), "_writer", None)  # benchmark-only look at a private field
    child = getattr(writer, "_child", None)
    if child:
        try:
            os.kill(child[0], 9)
            os.waitpid(child[0], 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        writer._child = None  # its optimizer hook stays registered and polls the writer: nothing left to reap
        writer._pending.clear()


def disk_ceiling(root: Path, nbytes: int) -> tuple[float, str]:
    """Sequential O_DIRECT write bandwidth (B/s) of the checkpoint disk, with fsync."""
    size = max(256 << 20, min(nbytes, 4 << 30)) >> 20 << 20
    target = root / "fio.bin"
    if shutil.which("fio"):
        cmd = ["fio", "--name=ceiling", f"--filename={target}", "--rw=write", "--bs=4M", f"--size={size}",
               "--direct=1", "--ioengine=libaio", "--iodepth=16", "--end_fsync=1", "--output-format=json"]  # fmt: skip
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        target.unlink(missing_ok=True)
        return float(res["jobs"][0]["write"]["bw_bytes"]), f"fio seq write 4M qd16 O_DIRECT {size >> 20} MiB"
    from carina.io import Direct, IOConfig, IOEngine, aligned_buffer

    buf = aligned_buffer(64 << 20)
    t0 = time.perf_counter()
    with IOEngine(IOConfig(direct=Direct.ON)) as eng:
        h = eng.open(target, "w", size=size)
        futs = [eng.write(h, off, buf) for off in range(0, size, len(buf))]
        for f in futs:
            f.result()
        eng.fsync(h)
        eng.close_file(h)
    bw = size / (time.perf_counter() - t0)
    target.unlink(missing_ok=True)
    return bw, f"carina.io seq write O_DIRECT {size >> 20} MiB (fio absent)"


def sync_copy_s(model: Any, opt: Any) -> float:
    """A blocking copy of the whole state into host memory (what a synchronous snapshot costs)."""
    tensors = list(model.state_dict().values())
    for s in opt.state_dict()["state"].values():
        tensors += [v for v in s.values() if torch.is_tensor(v)]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=20e6)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--writers", default="fork,process,thread")
    ap.add_argument("--peers", default="torch.save,dcp.save,dcp.async_save")
    ap.add_argument("--dir", default=None, help="checkpoint disk (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default=None)
    ap.add_argument("--budget-s", type=float, default=0, help="skip methods once this much time has passed")
    ap.add_argument("--save-deadline-s", type=float, default=0, help="give up a method whose save takes longer")
    args = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    root = Path(args.dir or tempfile.mkdtemp(prefix="carina-ckpt-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    model, opt, x = build(args.params, args.device)
    step = make_step(model, opt, x, args.device)
    for _ in range(5):
        step()
    base = statistics.median(step() for _ in range(10))
    nbytes = state_bytes(model, opt)
    ceiling_bw, ceiling_src = disk_ceiling(root, nbytes)
    copy_s = sync_copy_s(model, opt)
    print(f"state {nbytes / 1e9:.3f} GB, step {base * 1e3:.1f} ms, disk {ceiling_bw / 1e9:.2f} GB/s, "
          f"setup {time.perf_counter() - t_start:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    write(args, results, nbytes, base, ceiling_bw, ceiling_src, copy_s)  # the setup figures, before any method
    ours = [f"carina-{w}" for w in args.writers.split(",") if w]
    theirs = [p for p in args.peers.split(",") if p]
    # Alternate carina writers and peers, so a --budget-s cut leaves both sides measured.
    methods = [m for pair in zip_longest(ours, theirs) for m in pair if m]
    peers_cls = {"torch.save": TorchSave, "dcp.save": DcpSave, "dcp.async_save": DcpAsync}
    for i, name in enumerate(methods):
        if args.budget_s and time.perf_counter() - t_start > args.budget_s:
            results[name] = {"skipped": "time budget"}
            continue
        sub = root / name
        sub.mkdir(exist_ok=True)
        t_method = time.perf_counter()
        m: Any = None
        try:
            if name.startswith("carina-"):
                m = Carina(sub, model, opt, name.removeprefix("carina-"))
            else:
                m = peers_cls[name](sub, model, opt)
            rows = measure(m, step, args.reps, args.min_steps, 1000 * (i + 1), args.save_deadline_s)
        except Exception as exc:  # e.g. /dev/shm too small for the process writer: record it, go on
            if isinstance(exc, SaveTimeout):
                abandon(m)
            results[name] = {"error": str(exc)}
            print(name, "failed:", exc, file=sys.stderr, flush=True)
            write(args, results, nbytes, base, ceiling_bw, ceiling_src, copy_s)
            continue
        results[name] = {**summarize(rows), "reps": rows}
        shutil.rmtree(sub, ignore_errors=True)
        print(name, json.dumps({k: round(v, 4) for k, v in summarize(rows).items()}),
              f"({time.perf_counter() - t_method:.1f} s)", file=sys.stderr, flush=True)  # fmt: skip
        write(args, results, nbytes, base, ceiling_bw, ceiling_src, copy_s)  # after every method: a kill loses little
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


def c_ok(v: dict[str, Any]) -> bool:
    """Whether a method produced measurements (not skipped or failed)."""
    return "stall_s_median" in v


def note(v: dict[str, Any]) -> str:
    """Why a method has no measurements."""
    return str(v.get("error") or v.get("skipped") or "")


def write(args: Any, results: dict[str, Any], nbytes: int, base: float, bw: float, src: str, copy_s: float) -> None:
    done = {k: v for k, v in results.items() if "stall_s_median" in v}
    peers = {k: v for k, v in done.items() if not k.startswith("carina-")}
    figures = []
    for name, r in done.items():
        if not name.startswith("carina-"):
            continue
        w = name.split("-", 1)[1]
        figures.append(Figure(name=f"stall_per_ckpt_{w}", value=r["stall_s_median"], unit="s", higher_is_better=False,
                              peers={p: v["stall_s_median"] for p, v in peers.items()}))  # fmt: skip
        figures.append(Figure(name=f"time_to_durable_{w}", value=r["durable_s_median"], unit="s",
                              higher_is_better=False, ceiling=nbytes / bw, ceiling_source=f"state bytes / {src}",
                              peers={p: v["durable_s_median"] for p, v in peers.items()}))  # fmt: skip
    keys = ("blocking_s_median", "interference_s_median", "stall_s_median", "durable_s_median", "first_stall_s")
    summary = [{"method": k, **{c: round(v[c], 4) for c in keys}} if c_ok(v) else {"method": k, "note": note(v)}
               for k, v in results.items()]  # fmt: skip
    metrics = {"summary": summary, "state_bytes": nbytes, "step_s_median": base, "disk_write_Bps": bw,
               "disk_ceiling_source": src, "sync_copy_s": copy_s, "methods": results}  # fmt: skip
    device = args.device
    name = args.name or f"ckpt_stall_{device}"
    arg_keys = ("params", "device", "reps", "min_steps", "writers", "peers", "threads", "budget_s", "save_deadline_s")
    cfg = {k: getattr(args, k) for k in arg_keys}
    notes = (f"{nbytes / 1e9:.2f} GB state (fp32 params + AdamW moments), MLP {args.params:.3g} params on {device}; "
             "stall = blocking + sum(step - median of the clean steps just before it) while the save is in "
             "flight; medians exclude the first save (reported as first_stall_s). Written after the setup and "
             "after every method: methods absent from metrics.summary were not reached.")  # fmt: skip
    rec = make_record(name=name, figures=figures, config=cfg, metrics=metrics, notes=notes, environment=_env())
    print(write_record(rec), file=sys.stderr, flush=True)


_ENV: list[Any] = []


def _env() -> Any:
    """This machine's environment (carina doctor), collected once per run."""
    if not _ENV:
        from carina.core.doctor import collect
        from carina.core.progress import to_jsonable

        _ENV.append(to_jsonable(collect(paths=())))
    return _ENV[0]


if __name__ == "__main__":
    main()
