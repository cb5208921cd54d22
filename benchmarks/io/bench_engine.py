"""carina.io against fio (the ceiling) and common Python read paths, in one run.

For each case (sequential 1 MiB reads at queue depth 32, random 4 KiB reads at
queue depth 32 and 128, random 64 KiB reads at queue depth 64) on one file
written with carina's verifiable pattern:

* ceiling: fio (io_uring engine, O_DIRECT) on the same file, same block size
  and queue depth;
* carina: the ``uring`` and ``posix`` backends through ``IOEngine.gather``
  (timed pass), then a verification pass that checks every byte read;
* peers: a plain Python ``os.preadv`` loop on an O_DIRECT descriptor, a
  16-thread ``concurrent.futures`` pool of ``os.preadv``, ``numpy.fromfile``
  per block (page cache dropped first) and, for sequential reads,
  ``torch.from_file`` of the whole file.

With CUDA, one more figure: disk -> pinned staging -> GPU through
``IOEngine.read_staged`` versus ``torch.load(..., map_location="cuda")``.

Usage: python benchmarks/io/bench_engine.py [--dir DIR] [--size 2G] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disk_ceiling import fio_read_cmd

from carina.core.bench import Figure, make_record, write_record
from carina.io import IOConfig, IOEngine, aligned_buffer, drop_cache
from carina.io.workload import Access, fill_file, parse_size, run_case

CASES = [("seq", 1 << 20, 32), ("rand", 4096, 32), ("rand", 4096, 128), ("rand", 65536, 64)]


def fio_case(fio: str, path: Path, size: int, access: str, block: int, qd: int, seconds: float) -> dict[str, float]:
    """fio's read rate on ``path`` for one case (O_DIRECT, io_uring, huge-page buffers where reserved)."""
    rw = "read" if access == "seq" else "randread"
    cmd, _ = fio_read_cmd(fio, str(path), size, rw=rw, block=block, depth=qd, seconds=int(seconds))
    job = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["jobs"][0]
    return {
        "bytes_per_s": float(job["read"]["bw_bytes"]),
        "iops": float(job["read"]["iops"]),
        "cpu_pct": float(job["usr_cpu"]) + float(job["sys_cpu"]),
    }


def _offsets(access: str, block: int, size: int, count: int = 1 << 18) -> np.ndarray:
    if access == "seq":
        return (np.arange(count) % (size // block)) * block
    return np.random.default_rng(7).integers(0, size // block, count) * block


def _window(offs: np.ndarray, turn: int, n: int) -> list[int]:
    start = (turn * n) % (len(offs) - n)
    return [int(x) for x in offs[start : start + n]]


def _timed(seconds: float, body: Callable[[int], int]) -> tuple[float, float]:
    """Call ``body(round)`` (returns requests done) until ``seconds`` pass; (requests/s, wall)."""
    done, t0, turn = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        done += body(turn)
        turn += 1
    wall = time.perf_counter() - t0
    return done / wall, wall


def peer_rates(path: Path, size: int, access: str, block: int, qd: int, seconds: float) -> dict[str, float]:
    """Requests/s of the peers for one case."""
    offs = _offsets(access, block, size)
    bufs = [aligned_buffer(block) for _ in range(qd)]
    out: dict[str, float] = {}
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:

        def loop(turn: int) -> int:
            for off in _window(offs, turn, 64):
                os.preadv(fd, [bufs[0]], off)
            return 64

        def pooled(turn: int) -> int:
            jobs = zip(bufs, _window(offs, turn, qd), strict=True)
            list(pool.map(lambda job: os.preadv(fd, [job[0]], job[1]), jobs))
            return qd

        out["python_preadv_loop"] = _timed(seconds, loop)[0]
        with ThreadPoolExecutor(16) as pool:
            out["threadpool16_preadv"] = _timed(seconds, pooled)[0]
    finally:
        os.close(fd)

    def fromfile(turn: int) -> int:
        for off in _window(offs, turn, 64):
            np.fromfile(path, dtype=np.uint8, count=block, offset=off)
        return 64

    drop_cache(path)
    out["numpy_fromfile"] = _timed(seconds, fromfile)[0]
    if access == "seq":
        drop_cache(path)
        out["torch_from_file"] = _torch_from_file(path, size) / block
    return out


def _torch_from_file(path: Path, size: int) -> float:
    import torch

    t0 = time.perf_counter()
    tensor = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8).clone()  # fault every page in
    wall = time.perf_counter() - t0
    assert tensor.numel() == size
    return size / wall


def carina_case(backend: str, path: Path, access: str, block: int, qd: int, seconds: float) -> dict[str, float]:
    """Timed pass (no checking), then a checked pass; rates and CPU use of the timed pass.

    The engine's queue depth is the case's: at most ``qd`` requests are in the
    kernel (posix: ``min(qd, 16)`` threads). Requests come in gathers of up to
    8 MiB (at least ``qd`` rows), two at a time, as mini-batches would.
    """
    rows = max(qd, (8 << 20) // block)
    with IOEngine(IOConfig(backend=backend, queue_depth=qd, workers=min(qd, 16))) as engine:
        handle = engine.open(path, "r")
        case = {"kind": "read", "access": Access(access), "block": block, "queue_depth": qd, "rows": rows}
        t_cpu = os.times()
        timed = run_case(engine, handle, seconds=seconds, verify=False, **case)  # type: ignore[arg-type]
        t_end = os.times()
        checked = run_case(engine, handle, seconds=min(seconds, 1.0), verify=True, **case)  # type: ignore[arg-type]
    assert checked.verified_bytes == checked.bytes
    cpu = (t_end.user - t_cpu.user) + (t_end.system - t_cpu.system)
    return {
        "iops": timed.iops,
        "bytes_per_s": timed.bytes_per_s,
        "cores": cpu / timed.seconds,
        "verified_bytes": checked.verified_bytes,
        "rows_per_gather": rows,
    }


def gpu_case(engine: IOEngine, handle: Any, path: Path, size: int, workdir: Path) -> dict[str, float] | None:
    """Disk -> pinned staging -> GPU through carina, against torch.load to CUDA. None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    chunk, window = 4 << 20, 32
    total = min(size, 4 << 30) // chunk * chunk
    dest = torch.empty(total, dtype=torch.uint8, device="cuda")
    engine.read_staged(handle, 0, dest[:chunk]).stream_wait()  # warm up the copy stream and arena
    drop_cache(path)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pending: list[Any] = []
    for off in range(0, total, chunk):
        pending.append(engine.read_staged(handle, off, dest[off : off + chunk]))
        if len(pending) >= window:
            pending.pop(0).stream_wait()
    for fut in pending:
        fut.stream_wait()
    torch.cuda.synchronize()
    carina = total / (time.perf_counter() - t0)
    words = torch.arange(total // 8, dtype=torch.int64, device="cuda") ^ _signed_key()
    assert torch.equal(dest.view(torch.int64), words), "GPU bytes differ from the pattern"
    del words
    peer = _torch_load_cuda(path, total, workdir)
    host = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(16):
        dest[: 64 << 20].copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    h2d = 16 * (64 << 20) / (time.perf_counter() - t0)
    return {"carina": carina, "torch_load_cuda": peer, "h2d_pinned": h2d, "bytes": total}


def _signed_key() -> int:
    from carina.io.workload import _key

    return int(np.array([_key(0)], dtype=np.uint64).view(np.int64)[0])


def _torch_load_cuda(path: Path, total: int, workdir: Path) -> float:
    import torch

    saved = workdir / "peer.pt"
    torch.save(torch.from_file(str(path), shared=True, size=total, dtype=torch.uint8).clone(), saved)
    drop_cache(saved)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loaded = torch.load(saved, map_location="cuda")
    torch.cuda.synchronize()
    rate = total / (time.perf_counter() - t0)
    assert loaded.numel() == total
    saved.unlink()
    return rate


def _figures(results: dict[str, Any]) -> list[Figure]:
    figs = []
    for key, r in results["cases"].items():
        access, block, qd = key.split("/")
        per_req = int(block)
        bw = per_req >= 65536
        scale = (per_req / 1e9) if bw else 1.0
        value = r["uring"]["iops"] * scale
        peers = {"carina_posix": r["posix"]["iops"] * scale, **{k: v * scale for k, v in r["peers"].items()}}
        figs.append(
            Figure(
                name=f"{access}_read_{per_req // 1024}KiB_qd{qd}",
                value=value,
                unit="GB/s" if bw else "IOPS",
                ceiling=r["fio"]["iops"] * scale,
                ceiling_source="fio io_uring O_DIRECT, same file/block/queue depth, same run",
                peers=peers,
            )
        )
    if results.get("gpu"):
        g = results["gpu"]
        figs.append(
            Figure(
                name="disk_to_gpu",
                value=g["carina"] / 1e9,
                unit="GB/s",
                ceiling=results["cases"]["seq/1048576/32"]["fio"]["bytes_per_s"] / 1e9,
                ceiling_source="fio sequential 1 MiB read QD32 (the disk is the narrower link)",
                peers={"torch_load_cuda": g["torch_load_cuda"] / 1e9},
            )
        )
    return figs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk to test")
    parser.add_argument("--size", default="2G")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--fio", default=shutil.which("fio"), help="fio binary (the ceiling)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<machine>)")
    args = parser.parse_args()
    if not args.fio:
        sys.exit("fio is needed for the ceiling: apt-get install -y fio")
    size = parse_size(args.size)
    workdir = Path(tempfile.mkdtemp(prefix="carina-io-bench-", dir=args.dir))
    path = workdir / "data.bin"
    try:
        results = run_all(args.fio, path, size, args.seconds, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    config = {"size": size, "seconds": args.seconds, "cases": CASES, "queue_depth_max": 128}
    record = make_record(
        name="io_engine",
        figures=_figures(results),
        config=config,
        metrics=results,
        notes="carina rates are of the timed pass; a second pass checked every byte it read.",
    )
    print(write_record(record, directory=args.out))


def run_all(fio: str, path: Path, size: int, seconds: float, workdir: Path) -> dict[str, Any]:
    """Every case: fio, carina uring and posix, peers; then the GPU figure."""
    results: dict[str, Any] = {"cases": {}}
    with IOEngine(IOConfig(backend="uring", queue_depth=128, bounce_bytes=256 << 20)) as uring:
        h = uring.open(path, "w")
        fill_file(uring, h, size)
        for access, block, qd in CASES:
            key = f"{access}/{block}/{qd}"
            print(f"case {key}", file=sys.stderr)
            results["cases"][key] = {
                "fio": fio_case(fio, path, size, access, block, qd, seconds),
                "uring": carina_case("uring", path, access, block, qd, seconds),
                "posix": carina_case("posix", path, access, block, qd, seconds),
                "peers": peer_rates(path, size, access, block, qd, seconds),
            }
        results["gpu"] = gpu_case(uring, h, path, size, workdir)
    return results


if __name__ == "__main__":
    main()
