"""Payload-engine throughput without the network: how fast can an engine (de)compress blocks?

The NBD load test (:mod:`carina.infra.storage.loadtest`) measures the whole
tier with a client on the same machine; this measures the engine alone, so the
scaling of a worker pool (and of a GPU) is not hidden by the event loop or the
client. ``streams`` coroutines each own an arena region and submit one batch of
``batch`` blocks after another; batches submitted in the same loop turn are
coalesced and spread over the workers, as in the tier::

    rate = engine_rate(EngineConfig(kind=EngineKind.THREAD, workers=2), Codec.LZ4, data, block=65536)
    rate["compress_mb_s"], rate["decompress_mb_s"], rate["ratio"]

The last batch of every stream is compared with its source blocks, so a fast
but wrong engine fails instead of winning.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from carina.core.errors import IOEngineError
from carina.infra.storage.codecs import Codec, Job, Op, run_jobs
from carina.infra.storage.config import EngineConfig
from carina.infra.storage.engines import PayloadEngine, build_engine

__all__ = ["available_cores", "cpu_seconds_self", "engine_rate", "payload_dataset"]


def cpu_seconds_self() -> float:
    """CPU seconds of this process (all threads) plus its live child processes (worker pools)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    pids = [os.getpid()]
    try:
        pids += [int(c) for c in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()]
    except OSError:
        pass
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _layout(streams: int, batch: int, block: int) -> list[tuple[int, int, int]]:
    """Per stream: offsets of its source, stored and round-trip regions (``batch`` blocks each)."""
    span = batch * block
    return [(3 * s * span, (3 * s + 1) * span, (3 * s + 2) * span) for s in range(streams)]


Feed = Callable[[int, int], list[Job]]


async def _pump(engine: PayloadEngine, streams: int, feed: Feed, seconds: float) -> tuple[int, float, list[int]]:
    """Each stream: ``feed(stream, k)`` (stages batch ``k`` in the arena, returns its jobs), run, repeat.

    Returns the payload bytes done, the elapsed seconds and each stream's last ``k``.
    """
    deadline = time.perf_counter() + seconds
    done = [0]
    last = [0] * streams

    async def stream(i: int) -> None:
        k = 0
        while True:
            jobs = feed(i, k)
            await engine.run(jobs)
            done[0] += sum(j[3] if j[0] == Op.COMPRESS else j[5] for j in jobs)
            last[i] = k
            k += 1
            if time.perf_counter() >= deadline:
                return

    t0 = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(streams)))
    return done[0], time.perf_counter() - t0, last


class _Bench:
    """Stages fresh payloads in the arena for every batch, as the front end does (recv, pread)."""

    def __init__(self, engine: PayloadEngine, codec: Codec, data: bytes, *, block: int, batch: int, streams: int):
        self.view, self.codec, self.data = engine.arena.view, int(codec), data
        self.block, self.batch, self.streams = block, batch, streams
        self.nblocks = len(data) // block
        self.regions = _layout(streams, batch, block)
        # every block compressed once up front (untimed, one batch): what the store would hand back on reads
        n, b = self.nblocks, block
        scratch = memoryview(bytearray(2 * n * b))
        scratch[: n * b] = data[: n * b]
        jobs = [(int(Op.COMPRESS), self.codec, j * b, b, (n + j) * b, b, 0) for j in range(n)]
        self.stored: list[tuple[int, bytes, int]] = [
            (used, bytes(scratch[(n + j) * b : (n + j) * b + ln]), crc)
            for j, (used, ln, crc) in enumerate(run_jobs(scratch, jobs, device=getattr(engine, "device", "cpu")))
        ]

    def block_of(self, stream: int, k: int, i: int) -> int:
        """Data-set block staged as block ``i`` of batch ``k`` of ``stream`` (all streams walk the data set)."""
        return ((k * self.streams + stream) * self.batch + i) % self.nblocks

    def compress(self, stream: int, k: int) -> list[Job]:
        src, out, _ = self.regions[stream]
        b = self.block
        for i in range(self.batch):
            j = self.block_of(stream, k, i)
            self.view[src + i * b : src + (i + 1) * b] = self.data[j * b : (j + 1) * b]
        return [(int(Op.COMPRESS), self.codec, src + i * b, b, out + i * b, b, 0) for i in range(self.batch)]

    def decompress(self, stream: int, k: int) -> list[Job]:
        _, out, back = self.regions[stream]
        b = self.block
        jobs: list[Job] = []
        for i in range(self.batch):
            codec, payload, crc = self.stored[self.block_of(stream, k, i)]
            if payload:
                self.view[out + i * b : out + i * b + len(payload)] = payload
                jobs.append((int(Op.DECOMPRESS), codec, out + i * b, len(payload), back + i * b, b, crc))
        return jobs

    def verify(self, last: list[int]) -> None:
        """The last batch of every stream must have come back bit-exact."""
        b = self.block
        for stream, k in enumerate(last):
            _, _, back = self.regions[stream]
            for i in range(self.batch):
                j = self.block_of(stream, k, i)
                if self.stored[j][1] and self.view[back + i * b : back + (i + 1) * b] != self.data[j * b : (j + 1) * b]:
                    raise IOEngineError("engine round trip changed a block", offset=j * b)

    def ratio(self) -> float:
        kept = sum(len(p) for _, p, _ in self.stored if p)
        return sum(self.block for _, p, _ in self.stored if p) / kept if kept else 0.0


async def _measure(engine: PayloadEngine, codec: Codec, data: bytes, *, block: int, batch: int, streams: int,
                   seconds: float) -> dict[str, Any]:  # fmt: skip
    bench = _Bench(engine, codec, data, block=block, batch=batch, streams=streams)
    c0 = cpu_seconds_self()
    bytes_c, t_c, _ = await _pump(engine, streams, bench.compress, seconds)
    c1 = cpu_seconds_self()
    bytes_d, t_d, last = await _pump(engine, streams, bench.decompress, seconds)
    c2 = cpu_seconds_self()
    bench.verify(last)
    return {
        "compress_mb_s": bytes_c / t_c / 1e6,
        "decompress_mb_s": bytes_d / t_d / 1e6,
        "compress_cpu_s_per_gb": (c1 - c0) / max(bytes_c / 1e9, 1e-9),
        "decompress_cpu_s_per_gb": (c2 - c1) / max(bytes_d / 1e9, 1e-9),
        "ratio": bench.ratio(),
        "batches": engine.batches,
        "jobs_per_batch": engine.jobs / max(engine.batches, 1),
    }


def engine_rate(
    config: EngineConfig,
    codec: Codec,
    data: bytes,
    *,
    block: int = 64 << 10,
    batch: int = 8,
    streams: int = 8,
    seconds: float = 1.0,
) -> dict[str, Any]:
    """Compress then decompress MB/s of one engine over ``data``, in-process, bit-exact checked.

    Args:
        config: The engine (kind, workers, device).
        codec: Codec of the compress jobs.
        data: Data set; cut into ``block``-byte blocks, reused round robin.
        block: Block size.
        batch: Blocks per submitted batch (one NBD request of ``batch * block`` bytes).
        streams: Batches in flight (the client's queue depth, in requests).
        seconds: Duration of each phase.

    Raises:
        IOEngineError: A block did not come back bit-exact.
    """
    arena = 3 * streams * batch * block
    engine = build_engine(config, arena_bytes=arena, codec=codec)
    try:
        out = asyncio.run(_measure(engine, codec, data, block=block, batch=batch, streams=streams, seconds=seconds))
    finally:
        engine.close()
    return {"engine": config.kind.value, "workers": config.workers, "codec": codec.name.lower(), "block": block,
            "batch": batch, "streams": streams, **out}  # fmt: skip


def payload_dataset(nbytes: int, block: int) -> bytes:
    """Realistic non-zero payload: Python sources and shared libraries, ~60/40, all-zero blocks dropped.

    Deterministic for a given Python installation (sorted file lists, whole files);
    repeated to ``nbytes`` when the installation has fewer bytes (blocks are coded independently).
    """
    import sysconfig

    paths = sysconfig.get_paths()
    text = sorted(Path(paths["stdlib"]).rglob("*.py"))
    shared = Path(str(sysconfig.get_config_var("DESTSHARED") or paths["platstdlib"]))
    import numpy

    libs = sorted(shared.glob("*.so")) + sorted(Path(numpy.__file__).parent.rglob("*.so"))
    parts: list[bytes] = []
    for files, share in ((text, 0.6), (libs, 0.4)):
        buf, budget = bytearray(), int(nbytes * share)
        for f in files:
            if len(buf) >= budget:
                break
            buf += f.read_bytes()
        parts.append(bytes(buf[:budget]))
    mixed = bytearray()
    a, b = parts
    for i in range(0, max(len(a), len(b)), 3 * block):  # interleave 3 text blocks with 2 binary blocks
        mixed += a[i : i + 3 * block] + b[i * 2 // 3 : i * 2 // 3 + 2 * block]
    zero = bytes(block)
    blocks = [bytes(mixed[i : i + block]) for i in range(0, len(mixed) - block + 1, block)]
    kept = b"".join(x for x in blocks if x != zero)
    return (kept * (nbytes // max(len(kept), 1) + 1))[:nbytes] if kept else kept


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def available_cores(seconds: float = 1.0) -> float:
    """CPU this process could get right now: ``cpu_count`` busy-looping processes, their CPU-seconds per second.

    On a machine shared with other jobs this is what a worker pool can use at most,
    whatever ``os.cpu_count()`` says.
    """
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    t0, w0 = os.times(), time.perf_counter()
    procs = [ctx.Process(target=_spin, args=(seconds,)) for _ in range(os.cpu_count() or 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    t1 = os.times()
    used = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
    return used / (time.perf_counter() - w0)
