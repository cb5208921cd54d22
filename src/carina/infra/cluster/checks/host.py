"""Host checks: memory bandwidth and disk bandwidth (through carina.io)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from carina.infra.cluster.checks.base import Check, CheckContext, CheckResult, Status, Threshold

__all__ = ["DiskBandwidth", "HostMemoryBandwidth"]


class HostMemoryBandwidth(Check):
    """Host memory copy bandwidth (bytes read + written) of a large NumPy copy."""

    name = "host_mem_bw"
    rationale = "pinned staging of every offloaded tensor crosses host memory; a slow DIMM slows all of it"

    def _run(self, ctx: CheckContext) -> CheckResult:
        import numpy as np

        nbytes = (64 if ctx.quick else 1024) << 20
        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - start)
        metrics = {"host_mem_gbps": 2 * nbytes / best / 1e9}
        return _graded(self.name, ctx, metrics, "host_mem_gbps")


class DiskBandwidth(Check):
    """Sequential write and read bandwidth of each path, through carina.io (O_DIRECT where it works)."""

    name = "disk_bw"
    rationale = "offload and checkpoints stream through local disks; a degraded disk stalls training"

    def _run(self, ctx: CheckContext) -> CheckResult:
        metrics: dict[str, float] = {}
        for index, path in enumerate(ctx.paths):
            write, read, intact = _disk_pass(Path(path), (64 if ctx.quick else 1024) << 20)
            metrics[f"disk{index}_write_gbps"], metrics[f"disk{index}_read_gbps"] = write, read
            if not intact:
                return CheckResult(self.name, Status.FAIL, f"{path}: read back different bytes", metrics)
        worst = Status.PASS
        notes = []
        for key, value in metrics.items():
            if key in ctx.specs:
                status = Threshold().grade(value, float(ctx.specs[key]))
                worst = status if status.rank > worst.rank else worst
                if status is not Status.PASS:
                    notes.append(f"{key} {value:.2f} GB/s vs {ctx.specs[key]}")
        summary = ", ".join(f"{k} {v:.2f}" for k, v in metrics.items())
        return CheckResult(
            self.name,
            worst,
            "; ".join(notes) or summary,
            metrics,
            {k: float(v) for k, v in ctx.specs.items() if k in metrics},
        )


def _disk_pass(directory: Path, nbytes: int) -> tuple[float, float, bool]:
    """Write then read back ``nbytes`` in 4 MiB requests; return (write GB/s, read GB/s, bytes intact)."""
    from carina.io import IOConfig, IOEngine, aligned_buffer, drop_cache

    chunk = 4 << 20
    nbytes = max(chunk, nbytes // chunk * chunk)
    buf = aligned_buffer(chunk)
    buf[:] = 0xA5
    handle_fd, name = tempfile.mkstemp(dir=directory, prefix=".carina-disk-")
    os.close(handle_fd)
    try:
        with IOEngine(IOConfig(queue_depth=16)) as eng:
            h = eng.open(name, "w", size=nbytes)
            start = time.perf_counter()
            futures = [eng.write(h, off, buf) for off in range(0, nbytes, chunk)]
            for fut in futures:
                fut.result()
            eng.fsync(h)
            write = nbytes / (time.perf_counter() - start) / 1e9
            eng.close_file(h)
            drop_cache(name)
            h = eng.open(name, "r")
            outs = [aligned_buffer(chunk) for _ in range(min(16, nbytes // chunk))]
            start = time.perf_counter()
            futures = [eng.read(h, off, outs[i % len(outs)]) for i, off in enumerate(range(0, nbytes, chunk))]
            for fut in futures:
                fut.result()
            read = nbytes / (time.perf_counter() - start) / 1e9
            eng.close_file(h)
        intact = all(bool((out == 0xA5).all()) for out in outs)
    finally:
        os.unlink(name)
    return write, read, intact


def _graded(name: str, ctx: CheckContext, metrics: dict[str, float], key: str) -> CheckResult:
    if key not in ctx.specs:
        return CheckResult(name, Status.PASS, f"{metrics[key]:.1f} GB/s", metrics)
    spec = float(ctx.specs[key])
    status = Threshold().grade(metrics[key], spec)
    return CheckResult(name, status, f"{metrics[key]:.1f} GB/s vs expected {spec}", metrics, {key: spec})
