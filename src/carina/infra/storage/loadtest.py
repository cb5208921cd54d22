"""Load test of the tier with real clients: fio's NBD engine at a fixed queue depth, nbdcopy fills.

Every system under test gets the same data set (an ext4 image filled with
source text and binaries, the rest free space) and the same client load:

* ``fill``: ``nbdcopy`` writes the whole image (sequential, 256 KiB requests, multi-conn);
* ``randread`` / ``randwrite``: fio ``ioengine=nbd`` at queue depth 32, one request size;
  writes carry fio's 50 %-compressible buffers.

Systems: ``process`` (the tier with its worker-pool engine), ``thread`` (the
tier with codec threads), ``thread-loop`` (``workers - 1`` codec threads and the
event loop running what no idle thread takes: ``Overflow.LOOP``), ``process-loop``
(the same with ``workers - 1`` worker processes), ``inline`` (the
same tier with header and payload in one process), ``forward`` (the tier with
codec ``raw``: no compression) and ``nbdkit`` (nbdkit's plain file plugin, an
uncompressed NBD server). A tier system named with ``-fe<N>`` (``inline-fe2``,
``process-fe2``) runs as ``N`` front-end processes on one port (``--frontends``);
give fio as many connections (``clients``) to spread over them. CPU time is read
from ``/proc`` for each server's process tree; the codec's single-core throughput on the data set is measured
in-process as the ceiling.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Collection, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core.config import Config, require
from carina.core.errors import BackendUnavailable
from carina.infra.storage.config import CodecName

__all__ = ["SYSTEMS", "BenchConfig", "codec_throughput", "make_dataset", "run_bench"]

SYSTEMS = ("process", "process-loop", "thread", "thread-loop", "inline", "forward", "nbdkit")


@dataclass(kw_only=True)
class BenchConfig(Config):
    """What the load test runs.

    Attributes:
        image_bytes: Size of the data set and of every export.
        block_sizes: Request sizes (also the tier's block size for that case).
        seconds: Length of each fio run.
        runs: fio runs per case; the median is reported.
        iodepth: Requests in flight per fio job.
        codec: Codec of the compressing tiers.
        workers: Worker processes of the ``process`` engine.
        systems: Which of :data:`SYSTEMS` to run, each optionally with ``-fe<N>`` (``N`` front ends).
        clients: fio connections (jobs) sharing ``iodepth`` (the total requests in flight).
    """

    image_bytes: int = 256 << 20
    block_sizes: list[int] = field(default_factory=lambda: [4 << 10, 64 << 10])
    seconds: float = 5.0
    runs: int = 3
    iodepth: int = 32
    codec: CodecName = CodecName.LZ4
    workers: int = 2
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    clients: int = 1

    def validate(self) -> None:
        """Check ranges and names."""
        require(self.image_bytes >= 16 << 20, "image_bytes must be at least 16 MiB", key="image_bytes")
        require(all(b >= 512 for b in self.block_sizes), "block sizes must be >= 512", key="block_sizes")
        require(self.seconds > 0 and self.runs > 0, "seconds and runs must be positive", key="runs")
        require(all(_valid_system(s) for s in self.systems), f"systems must be among {SYSTEMS}", key="systems")
        split = self.clients >= 1 and self.iodepth % self.clients == 0
        require(split, "iodepth must split evenly over clients", key="clients")


def split_system(system: str, known: Collection[str] = SYSTEMS) -> tuple[str, int]:
    """``"process-fe2"`` -> ``("process", 2)``: the system and its front-end processes (1 without a suffix)."""
    base, sep, fe = system.rpartition("-fe")
    if sep and fe.isdigit() and base in known and base != "nbdkit":
        return base, int(fe)
    return system, 1


def _valid_system(system: str) -> bool:
    base, frontends = split_system(system)
    return base in SYSTEMS and 1 <= frontends <= 64


def make_dataset(path: Path, nbytes: int) -> Path:
    """An ext4 image of ``nbytes``: ~35 % Python sources, up to 15 % shared libraries, the rest free space."""
    tree = path.parent / "dataset-tree"
    shutil.rmtree(tree, ignore_errors=True)
    budget = {"text": int(nbytes * 0.35), "bin": int(nbytes * 0.15)}
    import numpy

    shared = Path(str(sysconfig.get_config_var("DESTSHARED") or sysconfig.get_paths()["platstdlib"]))
    sources = {
        "text": sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")),
        "bin": sorted(shared.glob("*.so")) + sorted(Path(numpy.__file__).parent.rglob("*.so")),
    }
    for kind, files in sources.items():
        used, bundle, out = 0, 0, bytearray()
        for src in files:  # whole files, concatenated into ~1 MiB bundles (few inodes, fast to build)
            size = src.stat().st_size
            if used + size > budget[kind]:
                continue
            out += src.read_bytes()
            used += size
            if len(out) >= 1 << 20:
                _write_bundle(tree / kind / f"{bundle:04d}.{kind}", out)
                bundle, out = bundle + 1, bytearray()
        if out:
            _write_bundle(tree / kind / f"{bundle:04d}.{kind}", out)
    mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    path.unlink(missing_ok=True)
    subprocess.run([mkfs, "-q", "-F", "-b", "4096", "-d", str(tree), str(path), f"{nbytes >> 20}M"], check=True)
    shutil.rmtree(tree, ignore_errors=True)
    return path


def _write_bundle(path: Path, data: bytearray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def codec_throughput(data: bytes, block: int, codec: CodecName) -> dict[str, float]:
    """Single-core compress/decompress MB/s and ratio of ``codec`` over ``data`` in ``block`` pieces."""
    from carina.infra.storage.codecs import Op, run_jobs

    n = len(data) // block
    arena = memoryview(bytearray(2 * n * block))
    arena[: n * block] = data[: n * block]
    jobs = [(Op.COMPRESS, int(codec.codec), i * block, block, (n + i) * block, block, 0) for i in range(n)]
    t0 = time.perf_counter()
    res = run_jobs(arena, jobs)
    t1 = time.perf_counter()
    back = [(Op.DECOMPRESS, c, (n + i) * block, ln, i * block, block, crc) for i, (c, ln, crc) in enumerate(res) if ln]
    run_jobs(arena, back)
    t2 = time.perf_counter()
    stored = sum(ln for _, ln, _ in res)
    return {
        "compress_mb_s": n * block / (t1 - t0) / 1e6,
        "decompress_mb_s": len(back) * block / (t2 - t1) / 1e6,
        "ratio": len(back) * block / max(stored, 1),  # over non-zero blocks, as the store counts
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree_pids(pid: int) -> list[int]:
    out = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in children:
        out += _tree_pids(int(child))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


@dataclass
class Target:
    """A running NBD server under test."""

    system: str
    url: str
    proc: subprocess.Popen[str]
    store: Path | None


@contextmanager
def start_target(system: str, work: Path, cfg: BenchConfig, block: int) -> Iterator[Target]:
    """Start ``system`` serving an empty export of ``cfg.image_bytes``; stop it afterwards."""
    size = str(cfg.image_bytes)
    if system == "nbdkit":
        disk = work / "nbdkit.raw"
        with disk.open("wb") as f:
            f.truncate(cfg.image_bytes)
        port = _free_port()
        cmd = ["nbdkit", "-f", "--exit-with-parent", "-p", str(port), "-i", "127.0.0.1", "file", str(disk)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_port(port, proc)
        target = Target(system, f"nbd://127.0.0.1:{port}", proc, None)
    else:
        store = work / f"store-{system}-{block}"
        shutil.rmtree(store, ignore_errors=True)
        base, frontends = split_system(system)
        engine, codec = ("inline", "raw") if base == "forward" else (base, cfg.codec.value)
        workers, extra = cfg.workers, ["--frontends", str(frontends)] if frontends > 1 else []
        if base in ("thread-loop", "process-loop"):  # as many codec runners as the pool has, the loop being one
            engine, workers, extra = base[:-5], max(cfg.workers - 1, 1), [*extra, "--overflow", "loop"]
        cmd = [sys.executable, "-m", "carina", "storage", "serve", "--json", "--port", "0", "--store", str(store),
               "--size", size, "--block-size", str(block), "--engine", engine, "--codec", codec,
               "--workers", str(workers), "--slots", "64", "--stats-interval", "3600", *extra]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise BackendUnavailable(f"carina storage serve did not start: {proc.communicate()[1][-1000:]}")
        target = Target(system, json.loads(line)["url"], proc, store)
    try:
        yield target
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def _wait_port(port: int, proc: subprocess.Popen[str]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise BackendUnavailable(f"nbdkit exited: {proc.communicate()[1][-1000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise BackendUnavailable("nbdkit did not start listening", port=port)


def fio(url: str, *, rw: str, block: int, cfg: BenchConfig) -> dict[str, float]:
    """One fio run against ``url``; MB/s, IOPS, completion-latency percentiles and fio's own cores.

    ``cfg.clients`` fio jobs (one connection each) share the queue depth; their figures are summed.
    """
    cmd = ["fio", "--name=carina", "--ioengine=nbd", f"--uri={url}", f"--rw={rw}", f"--bs={block}",
           f"--iodepth={cfg.iodepth // cfg.clients}", f"--numjobs={cfg.clients}", "--group_reporting",
           f"--size={cfg.image_bytes}", "--time_based", f"--runtime={cfg.seconds}",
           "--ramp_time=1", "--randrepeat=1", "--output-format=json", "--buffer_compress_percentage=50",
           "--refill_buffers", f"--buffer_compress_chunk={block}"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    group = json.loads(out[out.index("{") :])["jobs"][0]
    job = group["read" if "read" in rw else "write"]
    pct = job["clat_ns"]["percentile"]
    return {
        "mb_s": job["bw_bytes"] / 1e6,
        "iops": job["iops"],
        "p50_ms": pct["50.000000"] / 1e6,
        "p99_ms": pct["99.000000"] / 1e6,
        "bytes": job["io_bytes"],
        "client_cores": (group["usr_cpu"] + group["sys_cpu"]) / 100 * cfg.clients,  # group_reporting averages jobs
    }


def _fill(target: Target, image: Path, block: int) -> dict[str, Any]:
    """Write the data set through ``nbdcopy``; MB/s, server CPU per GB, stored ratio."""
    pid = target.proc.pid
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    subprocess.run(["nbdcopy", str(image), target.url], check=True)
    fill_s, fill_cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
    row: dict[str, Any] = {"system": target.system, "block": block, "fill_mb_s": image.stat().st_size / fill_s / 1e6}
    row["fill_cpu_s_per_gb"] = fill_cpu / (image.stat().st_size / 1e9)
    if target.store is not None:
        from carina.infra.storage.store import read_store_summary

        row["ratio"] = read_store_summary(target.store)["ratio"]
    return row


def _fio_with_cpu(target: Target, rw: str, block: int, cfg: BenchConfig) -> dict[str, float]:
    """One fio run, with the server's CPU-s per GB and the cores it kept busy.

    The CPU is taken over the whole fio run (ramp included) and divided by the bytes fio timed (ramp
    excluded), so CPU-s per GB reads high by up to ``(seconds + 1) / seconds`` alike for every system;
    ``server_cores`` divides the same CPU by the run's wall time.
    """
    c0, t0 = cpu_seconds(target.proc.pid), time.perf_counter()
    res = fio(target.url, rw=rw, block=block, cfg=cfg)
    cpu = cpu_seconds(target.proc.pid) - c0
    res["cpu_s_per_gb"] = cpu / max(res["bytes"] / 1e9, 1e-9)
    res["server_cores"] = cpu / (time.perf_counter() - t0)
    return res


def _measure_block(work: Path, image: Path, block: int, cfg: BenchConfig) -> list[dict[str, Any]]:
    """All systems up at once; fio runs interleaved (order rotated each round) so load drift hits all alike."""
    with ExitStack() as stack:
        targets = [stack.enter_context(start_target(s, work, cfg, block)) for s in cfg.systems]
        rows = {t.system: _fill(t, image, block) for t in targets}
        for rw in ("randread", "randwrite"):
            runs: dict[str, list[dict[str, float]]] = {t.system: [] for t in targets}
            for k in range(cfg.runs):
                for t in targets[k % len(targets) :] + targets[: k % len(targets)]:
                    runs[t.system].append({"load1": os.getloadavg()[0], **_fio_with_cpu(t, rw, block, cfg)})
            for system, got in runs.items():
                for key in ("mb_s", "iops", "p50_ms", "p99_ms", "cpu_s_per_gb", "server_cores", "client_cores"):
                    rows[system][f"{rw}_{key}"] = statistics.median(r[key] for r in got)
                rows[system][f"{rw}_mb_s_runs"] = [round(r["mb_s"], 2) for r in got]
                rows[system][f"{rw}_load1_runs"] = [round(r["load1"], 2) for r in got]
    return list(rows.values())


def _ceilings(image: Path, cfg: BenchConfig) -> dict[str, dict[str, float]]:
    """Best of three single-core codec measurements per block size (a ceiling, so the least disturbed)."""
    data = image.read_bytes()
    out: dict[str, dict[str, float]] = {}
    for b in cfg.block_sizes:
        trials = [codec_throughput(data, b, cfg.codec) for _ in range(3)]
        out[str(b)] = {k: max(t[k] for t in trials) for k in trials[0]}
    return out


def run_bench(
    cfg: BenchConfig,
    *,
    record: bool = False,
    command: list[str] | None = None,
    name: str = "",
    main: str = "process",
    notes: str = "",
) -> dict[str, Any]:
    """Run every system on every block size; optionally write a benchmark record."""
    for tool in ("fio", "nbdcopy", "nbdkit"):
        if shutil.which(tool) is None:
            raise BackendUnavailable(f"{tool} is not installed (apt-get install fio libnbd-bin nbdkit)")
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="carina-storage-bench-") as tmp:
        work = Path(tmp)
        image = make_dataset(work / "dataset.ext4", cfg.image_bytes)
        ceilings = _ceilings(image, cfg)
        rows = [row for block in cfg.block_sizes for row in _measure_block(work, image, block, cfg)]
    result: dict[str, Any] = {
        "rows": rows,
        "ceilings": ceilings,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
    }
    if record:
        from carina.infra.storage.bench_record import write_bench_record

        result["record"] = str(write_bench_record(cfg, result, command=command, name=name, main=main, notes=notes))
    return result
