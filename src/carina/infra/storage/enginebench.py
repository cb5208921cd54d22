"""Payload-engine throughput without the network: how fast can an engine (de)compress blocks?

The NBD load test (:mod:`carina.infra.storage.loadtest`) measures the whole
tier with a client on the same machine; this measures the engine alone, so the
scaling of a worker pool (and of a GPU) is not hidden by the event loop or the
client. ``streams`` coroutines each own an arena region and submit one batch of
``batch`` blocks after another; batches submitted in the same loop turn are
coalesced and spread over the workers, as in the tier::

    rate = engine_rate(EngineConfig(kind=EngineKind.THREAD, workers=2), Codec.LZ4, data, block=65536)
    rate["compress_mb_s"], rate["decompress_mb_s"], rate["ratio"]

Every decompressed block is compared with its source once (CRC-32 of the
whole region), so a fast but wrong engine fails instead of winning.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from pathlib import Path
from typing import Any

from carina.core.errors import IOEngineError
from carina.infra.storage.codecs import Codec, Job, Op, Result
from carina.infra.storage.config import EngineConfig
from carina.infra.storage.engines import PayloadEngine, build_engine

__all__ = ["cpu_seconds_self", "engine_rate"]


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


async def _pump(engine: PayloadEngine, jobs: list[list[Job]], seconds: float) -> tuple[int, float, list[list[Result]]]:
    """Run each stream's job list over and over for ``seconds``; return batches done, elapsed, last results."""
    deadline = time.perf_counter() + seconds
    count = [0]
    last: list[list[Result]] = [[] for _ in jobs]

    async def stream(i: int) -> None:
        while True:
            last[i] = await engine.run(jobs[i])
            count[0] += 1
            if time.perf_counter() >= deadline:
                return

    t0 = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(len(jobs))))
    return count[0], time.perf_counter() - t0, last


async def _measure(engine: PayloadEngine, codec: Codec, data: bytes, *, block: int, batch: int, streams: int,
                   seconds: float) -> dict[str, Any]:  # fmt: skip
    view = engine.arena.view
    regions = _layout(streams, batch, block)
    nblocks = len(data) // block
    for s, (src, _, _) in enumerate(regions):
        for k in range(batch):
            j = (s * batch + k) % nblocks
            view[src + k * block : src + (k + 1) * block] = data[j * block : (j + 1) * block]
    op = int(Op.COMPRESS)
    comp: list[list[Job]] = [
        [(op, int(codec), src + k * block, block, out + k * block, block, 0) for k in range(batch)]
        for src, out, _ in regions
    ]
    c0 = cpu_seconds_self()
    n_c, t_c, stored = await _pump(engine, comp, seconds)
    c1 = cpu_seconds_self()
    dec: list[list[Job]] = [
        [(int(Op.DECOMPRESS), codec, out + k * block, ln, back + k * block, block, crc)
         for k, (codec, ln, crc) in enumerate(res) if ln > 0]
        for (_, out, back), res in zip(regions, stored, strict=True)
    ]  # fmt: skip
    n_d, t_d, _ = await _pump(engine, dec, seconds)
    c2 = cpu_seconds_self()
    _verify(view, regions, stored, block)
    logical = sum(block for res in stored for _, ln, _ in res if ln > 0)
    kept = sum(ln for res in stored for _, ln, _ in res if ln > 0)
    bytes_c = n_c * batch * block
    bytes_d = n_d * sum(len(d) for d in dec) / len(dec) * block  # streams decompress the same counts
    return {
        "compress_mb_s": bytes_c / t_c / 1e6,
        "decompress_mb_s": bytes_d / t_d / 1e6,
        "compress_cpu_s_per_gb": (c1 - c0) / (bytes_c / 1e9),
        "decompress_cpu_s_per_gb": (c2 - c1) / max(bytes_d / 1e9, 1e-9),
        "ratio": logical / kept if kept else 0.0,
        "batches": engine.batches,
        "jobs_per_batch": engine.jobs / max(engine.batches, 1),
    }


def _verify(view: memoryview, regions: list[tuple[int, int, int]], stored: list[list[Result]], block: int) -> None:
    """Every block that was stored compressed must have come back bit-exact."""
    for (src, _, back), res in zip(regions, stored, strict=True):
        for k, (_, ln, _) in enumerate(res):
            if ln <= 0:
                continue
            a = zlib.crc32(view[src + k * block : src + (k + 1) * block])
            b = zlib.crc32(view[back + k * block : back + (k + 1) * block])
            if a != b:
                raise IOEngineError("engine round trip changed a block", offset=src + k * block)


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
