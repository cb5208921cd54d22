"""Restore time: carina.ckpt vs torch.load vs torch.distributed.checkpoint.load, against the disk's read ceiling.

One run builds the bench_stall workload (ckpt_workload.py: an MLP stack or a
random-init Llama, AdamW with state), saves it once per method, then restores it
into the live model and optimizer (on the device) ``--reps`` times cold (the files evicted from the page cache with
``posix_fadvise(DONTNEED)``; in a VM the host may still cache them) and warm.
carina's restore reads every shard through carina.io, checks every crc32 and
only then loads; its read+verify part is timed on its own too. The ceiling is a
sequential O_DIRECT read of the carina shard (fio when present) measured in the
same run; the restored parameters are checked bitwise against the saved ones.

    python benchmarks/ckpt/bench_restore.py --params 16e6 --reps 3            # CPU
    python benchmarks/ckpt/bench_restore.py --model llama --params 125e6 --device cuda --reps 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ckpt_workload import build, make_step, state_bytes
from stall_record import env as _env

from carina.core.bench import Figure, make_record, write_record


def tensors(model: Any, opt: Any) -> list[Any]:
    """Every state tensor in a fixed order (optimizer key order may change on load_state_dict)."""
    out = list(model.state_dict().values())
    state = opt.state_dict()["state"]
    for pid in sorted(state):
        out += [v for _, v in sorted(state[pid].items()) if torch.is_tensor(v)]
    return out


def snapshot(model: Any, opt: Any) -> list[Any]:
    return [t.detach().clone() for t in tensors(model, opt)]


def bitwise(model: Any, opt: Any, saved: list[Any]) -> bool:
    """Whether the live state equals ``saved`` byte for byte (compared where it lives: fast on a GPU)."""
    now = tensors(model, opt)
    return len(now) == len(saved) and all(
        a.dtype == b.dtype and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
        for a, b in zip(now, saved, strict=True)
    )


def evict(root: Path) -> None:
    from carina.io import drop_cache

    for f in root.rglob("*"):
        if f.is_file():
            drop_cache(f)


def read_ceiling(file: Path) -> tuple[float, str]:
    """Sequential O_DIRECT read bandwidth (B/s) of ``file``."""
    size = file.stat().st_size >> 20 << 20
    if shutil.which("fio") and size >= 64 << 20:
        cmd = ["fio", "--name=ceiling", f"--filename={file}", "--rw=read", "--bs=4M", f"--size={size}",
               "--direct=1", "--ioengine=libaio", "--iodepth=16", "--output-format=json"]  # fmt: skip
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        return float(res["jobs"][0]["read"]["bw_bytes"]), f"fio seq read 4M qd16 O_DIRECT {size >> 20} MiB"
    from carina.io import Direct, IOConfig, IOEngine, aligned_buffer

    chunk = 16 << 20
    bufs = [aligned_buffer(chunk) for _ in range(8)]
    size = max(chunk, size)
    t0 = time.perf_counter()
    with IOEngine(IOConfig(direct=Direct.ON)) as eng:
        h = eng.open(file, "r")
        offs = list(range(0, size - chunk + 1, chunk))
        for i in range(0, len(offs), len(bufs)):
            futs = [eng.read(h, off, bufs[j]) for j, off in enumerate(offs[i : i + len(bufs)])]
            for f in futs:
                f.result()
        eng.close_file(h)
    return len(offs) * chunk / (time.perf_counter() - t0), f"carina.io seq read O_DIRECT {size >> 20} MiB (fio absent)"


class Method:
    """A saved copy of the state and a way to load it back into the live objects."""

    def __init__(self, name: str, root: Path, save: Callable[[], None], load: Callable[[], None]) -> None:
        self.name, self.root, self.load = name, root, load
        save()


def methods(root: Path, model: Any, opt: Any, device: str) -> list[Method]:
    import torch.distributed.checkpoint as dcp

    from carina.ckpt import Checkpointer, Config, WriterKind

    state = {"model": model, "optim": opt}
    ck = Checkpointer(Config(dir=str(root / "carina"), writer=WriterKind.SYNC, keep_last=1))

    def ck_save() -> None:
        ck.save(1, state)
        ck.wait()

    pt = root / "torch" / "state.pt"
    pt.parent.mkdir()

    def pt_save() -> None:
        with open(pt, "wb") as fh:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())

    def pt_load() -> None:
        sd = torch.load(pt, map_location="cpu", weights_only=True)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        if device == "cuda":
            torch.cuda.synchronize()

    dcp_dir = root / "dcp"

    def dcp_save() -> None:
        from torch.distributed.checkpoint import FileSystemWriter

        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        dcp.save(sd, checkpoint_id=str(dcp_dir), storage_writer=FileSystemWriter(str(dcp_dir), sync_files=True))

    def dcp_load() -> None:
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        dcp.load(sd, checkpoint_id=str(dcp_dir))  # in place into the live tensors
        opt.load_state_dict(sd["optim"])
        if device == "cuda":
            torch.cuda.synchronize()

    def ck_load() -> None:
        ck.restore(state)
        if device == "cuda":
            torch.cuda.synchronize()

    return [
        Method("carina", root / "carina", ck_save, ck_load),
        Method("torch.load", root / "torch", pt_save, pt_load),
        Method("dcp.load", dcp_dir, dcp_save, dcp_load),
    ]


def time_it(fn: Callable[[], Any], before: Callable[[], None] | None = None) -> float:
    if before is not None:
        before()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=16e6)
    ap.add_argument("--model", default="mlp", choices=("mlp", "llama"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="checkpoint disk (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None, help="record folder (default: benchmarks/results/<machine>)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    root = Path(tempfile.mkdtemp(prefix="carina-ckpt-restore-", dir=args.dir))
    model, opt, x = build(args.params, args.device, args.model)
    step = make_step(model, opt, x, args.device)
    for _ in range(2):
        step()
    nbytes = state_bytes(model, opt)
    saved = snapshot(model, opt)
    ms = methods(root, model, opt, args.device)
    shard = next((root / "carina").rglob("rank00000.safetensors"))
    evict(root)
    bw, src = read_ceiling(shard)
    print(f"state {nbytes / 1e9:.3f} GB, disk read {bw / 1e9:.2f} GB/s ({src})", file=sys.stderr, flush=True)
    from carina.ckpt.storage import select

    results: dict[str, dict[str, Any]] = {}
    ck_root = str(root / "carina")
    for m in ms:  # carina first: the record is written after every method, so a kill loses little
        step()  # the live state moves on; every restore must bring the saved one back
        cold = [time_it(m.load, functools.partial(evict, m.root)) for _ in range(args.reps)]
        warm = [time_it(m.load) for _ in range(args.reps)]
        results[m.name] = {"cold_s": cold, "warm_s": warm, "cold_s_median": statistics.median(cold),
                           "warm_s_median": statistics.median(warm),
                           "bitwise": bitwise(model, opt, saved)}  # fmt: skip
        if m.name == "carina":
            results["carina"]["read_verify_cold_s_median"] = statistics.median(
                time_it(lambda: select(ck_root), lambda: evict(root / "carina")) for _ in range(args.reps)
            )
        print(m.name, json.dumps({k: v for k, v in results[m.name].items() if not k.endswith("_s")}),
              file=sys.stderr, flush=True)  # fmt: skip
        write(args, results, nbytes, bw, src)
    shutil.rmtree(root, ignore_errors=True)


def write(args: Any, results: dict[str, Any], nbytes: int, bw: float, src: str) -> None:
    peers = {k: v for k, v in results.items() if k != "carina"}
    c = results["carina"]
    figures = [
        Figure(name="restore_cold", value=c["cold_s_median"], unit="s", higher_is_better=False, ceiling=nbytes / bw,
               ceiling_source=f"state bytes / {src}", peers={k: v["cold_s_median"] for k, v in peers.items()}),
        Figure(name="restore_warm", value=c["warm_s_median"], unit="s", higher_is_better=False,
               peers={k: v["warm_s_median"] for k, v in peers.items()}),
        Figure(name="restore_cold_GBps", value=nbytes / c["cold_s_median"] / 1e9, unit="GB/s",
               ceiling=bw / 1e9, ceiling_source=src,
               peers={k: nbytes / v["cold_s_median"] / 1e9 for k, v in peers.items()}),
    ]  # fmt: skip
    summary = [{"method": k, "cold_s_median": round(v["cold_s_median"], 4),
                "warm_s_median": round(v["warm_s_median"], 4),
                "cold_GBps": round(nbytes / v["cold_s_median"] / 1e9, 3), "bitwise": v["bitwise"]}
               for k, v in results.items()]  # fmt: skip
    metrics = {"summary": summary, "state_bytes": nbytes, "disk_read_Bps": bw, "disk_ceiling_source": src,
               "read_verify_cold_s_median": c["read_verify_cold_s_median"], "methods": results}  # fmt: skip
    name = args.name or f"ckpt_restore_{args.device}"
    cfg = {k: getattr(args, k) for k in ("params", "model", "device", "reps", "threads")}
    notes = (f"{nbytes / 1e9:.2f} GB state ({args.model} model, fp32 params + AdamW moments) restored into the "
             f"live model and optimizer on {args.device}; cold = files evicted with posix_fadvise(DONTNEED) before "
             "each restore (a VM host may "
             "still cache them); carina reads and checks every crc32 before loading; bitwise = restored state "
             "equals the saved one. Written after every method (carina first): a method absent from "
             "metrics.summary was not reached.")  # fmt: skip
    out = Path(args.out) if args.out else None
    record = make_record(name=name, figures=figures, config=cfg, metrics=metrics, notes=notes, environment=_env())
    print(write_record(record, directory=out), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
