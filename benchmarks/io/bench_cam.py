"""GPU-initiated gathers (CamGather) against host-initiated ones, with compute on the gathered rows.

Each batch: row ids made on the device (``torch.randint``, a device
generator), ``--rows`` rows of ``--row-bytes`` read from a file of random
bytes, then ``--work`` rounds of ``tanh(x @ W)`` on the rows' first 1024 bytes as fp32.
``--ahead`` batches are requested in advance on both paths:

Both paths run the same loop through ``carina.io.RowGather`` (one post/wait
interface), with ``--ahead + 1`` destination tensors and ring slots:

* ``gpu_initiated``: ``RowGather(path="gpu")``, i.e. ``CamGather``: ``post`` on
  the compute stream (ids copied into the mapped request ring, doorbell with
  ``cuStreamWriteValue32``), ``wait`` (``cuStreamWaitValue32``) before the
  compute; the host never synchronises with the GPU inside the loop.
* ``host_initiated``: ``RowGather(path="host")``: the ids are made and posted
  on a side stream (the host waits for that stream and reads them, and the
  ids never wait for the compute: the path's best case), the engine gathers
  into the engine's pinned staging arena, ``wait`` waits on the host for the
  read and copies the rows to the device on the compute stream; staging
  blocks go back to the arena once their copy's event has completed.

Records made before ``RowGather`` existed (session 6's ``io_cam_h200``) ran a
hand-written host path that synchronised the host with the compute stream
after every batch; the host path here does not.

The ceiling is batches / max(IO-only time, compute-only time), both measured
in the same run (IO-only: the same gathers of the same row ids with nothing
else; compute-only: the same matmuls on resident rows). The four passes run
``--repeats`` times in a rotating order and the figures are medians; each
pass's times are in ``metrics`` with their spread, and ``metrics.verdict``
says whether one path is faster beyond that spread (its slowest repetition
faster than the other's fastest) or the difference is inside the noise. The
file is fsynced and dropped from the page cache before the first pass, so no
pass pays for the writeback of another's rows. The last batch of each path is
checked byte for byte against the file. With ``--device cpu`` the same code
runs with host stores and waits (the numbers then say little).

Hangs: every phase and pass says on stderr when it starts and how long it
took; a pass still running after ``--pass-limit`` seconds (a phase after
four times that) dumps every thread's stack to stderr and exits 1, and so
does SIGTERM (the lane's ``timeout``). Session 6's first run through
``RowGather`` hung with no output at all; this says where the next one is.

Usage: python benchmarks/io/bench_cam.py --device cuda --file-size 1G --rows 1024 --batches 64 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carina.core.bench import Figure, make_record, write_record
from carina.io import IOConfig, IOEngine, RowGather, RowGatherConfig, aligned_buffer
from carina.io.workload import parse_size


@contextlib.contextmanager
def watched(what: str, limit: float) -> Iterator[None]:
    """Say on stderr that ``what`` starts and how long it took; past ``limit`` s dump all stacks and exit 1."""
    print(f"[bench_cam] {what} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    faulthandler.dump_traceback_later(limit, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    print(f"[bench_cam] {what}: {time.perf_counter() - t0:.3f} s", file=sys.stderr, flush=True)


def make_file(path: Path, size: int) -> None:
    """Random bytes, written in 64 MiB pieces, fsynced and dropped from the page cache.

    ``BENCH_CAM_STALL_S`` (tests only) sleeps that long first: a pass that overruns at a known, quiet point,
    so the watchdog's stack dump is tested without racing the interpreter's own start-up.
    """
    time.sleep(float(os.environ.get("BENCH_CAM_STALL_S", "0")))
    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        for _ in range(0, size, 64 << 20):
            f.write(rng.integers(0, 256, min(64 << 20, size), dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


class Batches:
    """Row ids per batch, made on the device from one generator (the same sequence for every path)."""

    def __init__(self, args: argparse.Namespace, nrows: int) -> None:
        self.args, self.nrows = args, nrows
        self.gen = torch.Generator(device=args.device)
        self.gen.manual_seed(0)

    def ids(self) -> torch.Tensor:
        return torch.randint(0, self.nrows, (self.args.rows,), device=self.args.device, generator=self.gen)


def compute(x: torch.Tensor, w: torch.Tensor, work: int) -> torch.Tensor:
    """``work`` rounds of ``tanh(y @ W)`` on the first ``len(W)`` bytes of each row, as values in [-0.5, 0.5]."""
    y = x[:, : w.shape[0]].float() / 255.0 - 0.5
    for _ in range(work):
        y = torch.tanh(y @ w)
    return y


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def gathered(eng: IOEngine, h: Any, args: argparse.Namespace, w: torch.Tensor, nrows: int, path: str) -> dict[str, Any]:
    """One pass of ``--batches`` batches through ``RowGather(path=...)``: the same loop for both paths.

    ``gpu``: the ids are made and posted on the compute stream. ``host``: the
    host reads the ids, so they are made and posted on a side stream that never
    waits for the compute (the host path's best case); ``wait`` then copies the
    rows on the compute stream.
    """
    dev, rb = args.device, args.row_bytes
    slots = args.ahead + 1
    dests = [torch.empty(args.rows, rb, dtype=torch.uint8, device=dev) for _ in range(slots)]
    batches = Batches(args, nrows)
    side = torch.cuda.Stream() if path == "host" and dev != "cpu" else None
    cfg = RowGatherConfig(row_bytes=rb, max_rows=args.rows, slots=slots, device=dev, path=path)
    with RowGather(eng, h, cfg) as g:
        sync(dev)
        t0 = time.perf_counter()
        queue: list[tuple[Any, torch.Tensor]] = []
        last_ids = None
        for i in range(args.batches):
            while len(queue) <= args.ahead and i + len(queue) < args.batches:
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    ids = batches.ids()
                    queue.append((g.post(ids, dests[(i + len(queue)) % slots]), ids))
            ticket, last_ids = queue.pop(0)
            g.wait(ticket)
            out = compute(dests[i % slots], w, args.work)
        sync(dev)
        wall = time.perf_counter() - t0
        stats = {**g.stats, "path": g.path}
        if path == "host":
            stats["arena_overflows"] = eng.staging_arena().overflows
    assert last_ids is not None
    return {
        "wall_s": wall,
        "last": (last_ids.cpu().numpy(), dests[(args.batches - 1) % slots].cpu()),
        "stats": stats,
        "out_sum": float(out.sum()),
    }


def io_only(eng: IOEngine, h: Any, args: argparse.Namespace, nrows: int) -> float:
    """The gathers alone, of the same row ids as the two paths (made on the device, read back before timing)."""
    batches = Batches(args, nrows)
    ids = [batches.ids().cpu().numpy() * args.row_bytes for _ in range(args.batches)]
    bufs = [aligned_buffer(args.rows * args.row_bytes) for _ in range(args.ahead + 1)]
    t0 = time.perf_counter()
    futs = []
    for i in range(args.batches):
        futs.append(eng.gather(h, ids[i], args.row_bytes, bufs[i % len(bufs)]))
        if len(futs) > args.ahead:
            futs.pop(0).result()
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def compute_only(args: argparse.Namespace, w: torch.Tensor, path: Path) -> float:
    """Seconds of the batches' compute on resident rows (the file's first rows: the same kind of data)."""
    rows = np.fromfile(path, dtype=np.uint8, count=args.rows * args.row_bytes).reshape(args.rows, args.row_bytes)
    x = torch.from_numpy(rows).to(args.device)
    compute(x, w, args.work)
    sync(args.device)
    t0 = time.perf_counter()
    for _ in range(args.batches):
        compute(x, w, args.work)
    sync(args.device)
    return time.perf_counter() - t0


def check(path: Path, res: dict[str, Any], rb: int) -> bool:
    ids, got = res.pop("last")
    want = np.fromfile(path, dtype=np.uint8).reshape(-1, rb)[ids]
    return bool(np.array_equal(got.numpy(), want))


PASSES = ("io_only", "compute_only", "gpu_initiated", "host_initiated")


def run_passes(eng: IOEngine, h: Any, args: argparse.Namespace, w: torch.Tensor, path: Path) -> dict[str, Any]:
    """``--repeats`` rounds of the four passes, the order rotated every round; every time kept."""
    nrows = h.size // args.row_bytes
    walls: dict[str, list[float]] = {name: [] for name in PASSES}
    last: dict[str, dict[str, Any]] = {}
    for rep in range(args.repeats):
        for name in PASSES[rep % 4 :] + PASSES[: rep % 4]:
            with watched(f"round {rep} {name}", args.pass_limit):
                if name == "io_only":
                    walls[name].append(io_only(eng, h, args, nrows))
                elif name == "compute_only":
                    walls[name].append(compute_only(args, w, path))
                else:
                    last[name] = gathered(eng, h, args, w, nrows, "gpu" if name == "gpu_initiated" else "host")
                    walls[name].append(last[name].pop("wall_s"))
    r: dict[str, Any] = {
        name: {
            "wall_s": walls[name],
            "median_s": statistics.median(walls[name]),
            "spread": (max(walls[name]) - min(walls[name])) / statistics.median(walls[name]),
        }
        for name in PASSES
    }
    for name in ("gpu_initiated", "host_initiated"):
        r[name].update(last[name])
    return r


def verdict(r: dict[str, Any]) -> str:
    """Which path is faster beyond the spread of its repetitions, or ``inside noise``."""
    gpu, host = r["gpu_initiated"]["wall_s"], r["host_initiated"]["wall_s"]
    if len(gpu) < 2:
        return "one repetition: no spread to judge by"
    if max(gpu) < min(host):
        return "gpu_initiated faster beyond noise"
    if max(host) < min(gpu):
        return "host_initiated faster beyond noise"
    return "inside noise"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--file-size", default="256M")
    p.add_argument("--row-bytes", type=int, default=4096)
    p.add_argument("--rows", type=int, default=1024, help="rows per batch")
    p.add_argument("--batches", type=int, default=32)
    p.add_argument("--ahead", type=int, default=2, help="batches requested in advance")
    p.add_argument("--work", type=int, default=8, help="tanh(x @ W) rounds per batch")
    p.add_argument("--queue-depth", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="rounds of the four passes (medians reported)")
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--name", default="io_cam")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--pass-limit", type=float, default=15.0, help="seconds a pass may run before stacks are dumped")
    args = p.parse_args()
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)  # the lane's timeout shows the stacks
    size = parse_size(args.file_size) // args.row_bytes * args.row_bytes
    work = Path(tempfile.mkdtemp(prefix="carina-cam-", dir=args.dir))
    path = work / "rows.bin"
    phase = 4 * args.pass_limit
    try:
        with watched(f"file of {size} bytes", phase):
            make_file(path, size)
        with watched(f"CUDA context and matmul weights on {args.device}", phase):
            width = min(1024, args.row_bytes)
            w = torch.randn(width, width, device=args.device) / width**0.5
            sync(args.device)
        arena = max(16 << 20, 4 * (args.ahead + 1) * args.rows * args.row_bytes)  # the host path's staging
        with IOEngine(IOConfig(backend="auto", queue_depth=args.queue_depth, bounce_bytes=arena)) as eng:
            h = eng.open(path, "r")
            with watched("warm-up gathers", phase):
                io_only(eng, h, args, size // args.row_bytes)  # reads the same rows as every pass
            r = run_passes(eng, h, args, w, path)
            r["backend"] = eng.backend.name
            print("[bench_cam] engine closing", file=sys.stderr, flush=True)
        with watched("checking the last batches against the file", phase):
            r["gpu_initiated"]["rows_equal"] = check(path, r["gpu_initiated"], args.row_bytes)
            r["host_initiated"]["rows_equal"] = check(path, r["host_initiated"], args.row_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not (r["gpu_initiated"]["rows_equal"] and r["host_initiated"]["rows_equal"]):
        sys.exit("rows differ from the file")
    r["io_only_s"], r["compute_only_s"] = r["io_only"]["median_s"], r["compute_only"]["median_s"]
    r["bound_s"] = max(r["io_only_s"], r["compute_only_s"])
    r["verdict"] = verdict(r)
    per_s = args.batches / r["gpu_initiated"]["median_s"]
    host_per_s = args.batches / r["host_initiated"]["median_s"]
    print(
        f"gpu-initiated {per_s:.1f} batches/s (spread {r['gpu_initiated']['spread']:.1%}), host-initiated "
        f"{host_per_s:.1f} (spread {r['host_initiated']['spread']:.1%}), bound {args.batches / r['bound_s']:.1f}; "
        f"{r['verdict']}"
    )
    fig = Figure(
        name="gpu_initiated_gather",
        value=per_s,
        unit="batches/s",
        ceiling=args.batches / r["bound_s"],
        ceiling_source=f"batches / max(IO-only gathers, compute-only matmuls), medians of {args.repeats}, same run",
        peers={"host_initiated_gather": host_per_s},
    )
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("dir", "out")}
    record = make_record(
        name=args.name,
        figures=[fig],
        config=cfg,
        metrics=r,
        notes="batch = rows random rows of row_bytes, then work rounds of tanh(x @ W); medians of --repeats rounds "
        "of the four passes in rotating order; metrics.<pass>.wall_s holds every round, spread = (max - min) / median. "
        "Both paths run through carina.io.RowGather (path gpu / host); metrics.<path>.stats.path names it.",
    )
    print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
