"""A few seconds' check of a GPU engine before the timed runs: bit-exact round trips, zlib CRCs.

``--engine torch`` (ZVC kernels) or ``--engine nvcomp`` (nVIDIA nvCOMP, ``--codecs lz4,zstd,deflate``); for nvcomp
the stored blocks are also decoded by the CPU codecs and CPU-written blocks by nvCOMP (the formats must agree).

Blocks of every kind (sparse, dense, all-zero, random) at 4 KiB and 64 KiB go through ``TorchEngine.run`` from
several concurrent requests (so pieces run on several launch threads and streams), come back through decompress,
and are compared with their sources; every stored block's CRC must equal ``zlib.crc32`` of its stored bytes, and a
wrong CRC must be reported as a checksum error. Prints PASS (and whether the arena is registered for DMA) or the
first mismatch, and exits non-zero on failure, so a device log says at once whether the GPU path works.

Run: python benchmarks/infra_storage/smoke_torch_engine.py --device cuda [--engine nvcomp --codecs lz4,zstd]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import zlib

import numpy as np

from carina.infra.storage.codecs import ERR_CHECKSUM, Codec, Op, codec_available, run_jobs
from carina.infra.storage.engines import PayloadEngine
from carina.infra.storage.torch_engine import TorchEngine


def _blocks(block: int, n: int) -> list[bytes]:
    rng = np.random.default_rng(block)
    kinds = [0.0, 0.02, 0.3, 0.7, 1.0]
    text = (b"def round_trip(engine, block):  # carina smoke text\n" * (block // 16 + 1))[:block]
    return [text if i % 6 == 5 else bytes((rng.integers(1, 256, block) * (rng.random(block) < kinds[i % 5])).astype(
        np.uint8)) for i in range(n)]  # fmt: skip


def _cross_check(engine: PayloadEngine, codec: Codec, stored: list, block: int, n: int) -> str:
    """The CPU codecs decode what the engine stored, and the engine decodes what the CPU stores."""
    if codec_available(codec) or codec == Codec.ZVC:
        return ""
    view = engine.arena.view
    back = [(Op.DECOMPRESS, c, (n + i) * block, s, (3 * n + i) * block, block, crc)
            for i, (c, s, crc) in enumerate(stored) if s]  # fmt: skip
    if any(r[1] != block for r in run_jobs(view, back)):
        return f"CPU {codec.name} could not decode what the engine stored"
    cpu = run_jobs(view, [(Op.COMPRESS, codec, i * block, block, (n + i) * block, block, 0) for i in range(n)])
    again = [(Op.DECOMPRESS, c, (n + i) * block, s, (3 * n + i) * block, block, crc)
             for i, (c, s, crc) in enumerate(cpu) if s and c == codec]  # fmt: skip
    res = asyncio.run(engine.run(again)) if again else []
    return "" if all(r[1] == block for r in res) else f"the engine could not decode CPU {codec.name} blocks"


async def _round_trip(engine: PayloadEngine, block: int, n: int, codec: Codec = Codec.ZVC) -> tuple[str, list]:
    blocks = _blocks(block, n)
    view = engine.arena.view
    for i, blk in enumerate(blocks):
        view[i * block : (i + 1) * block] = blk
    reqs = [engine.run([(Op.COMPRESS, codec, i * block, block, (n + i) * block, block, 0) for i in range(k, k + 8)])
            for k in range(0, n, 8)]  # fmt: skip
    stored = [r for part in await asyncio.gather(*reqs) for r in part]
    for i, (_, size, crc) in enumerate(stored):
        got = zlib.crc32(view[(n + i) * block : (n + i) * block + size]) if size else 0
        if crc != got:
            return f"block {i} ({block} B): CRC {crc:#x}, zlib says {got:#x}", stored
    back = [(Op.DECOMPRESS, c, (n + i) * block, s, (2 * n + i) * block, block, crc)
            for i, (c, s, crc) in enumerate(stored) if s]  # fmt: skip
    out = await asyncio.gather(*(engine.run(back[k : k + 8]) for k in range(0, len(back), 8)))
    if any(r[1] != block for part in out for r in part):
        return f"decompress errors at {block} B: {[r for part in out for r in part if r[1] != block][:3]}", stored
    for i, (_, size, _) in enumerate(stored):
        if size and bytes(view[(2 * n + i) * block : (2 * n + i + 1) * block]) != blocks[i]:
            return f"block {i} ({block} B) did not come back bit-exact", stored
    bad = await engine.run([(*back[0][:6], back[0][6] ^ 1)])
    if bad[0][1] != ERR_CHECKSUM:
        return f"a wrong CRC was not reported: {bad}", stored
    kinds = {c for c, _, _ in stored}
    return ("" if kinds >= {codec, Codec.RAW} else f"expected {codec.name} and raw blocks, got {kinds}"), stored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--engine", default="torch", choices=["torch", "nvcomp"])
    ap.add_argument("--codecs", default="lz4,zstd,deflate", help="codecs of the nvcomp engine")
    args = ap.parse_args()
    t0 = time.perf_counter()
    n = args.blocks
    engine: TorchEngine
    if args.engine == "nvcomp":
        from carina.infra.storage.nvcomp_engine import NvcompEngine

        engine = NvcompEngine(4 * n * (64 << 10), device=args.device, workers=2)
        codecs = [Codec[c.upper()] for c in args.codecs.split(",")]
    else:
        engine, codecs = TorchEngine(4 * n * (64 << 10), device=args.device, workers=2), [Codec.ZVC]
    try:
        for codec in codecs:
            for block in (4 << 10, 64 << 10):
                err, stored = asyncio.run(_round_trip(engine, block, n, codec))
                err = err or _cross_check(engine, codec, stored, block, n)
                if err:
                    raise SystemExit(f"FAIL {args.engine} engine ({codec.name}) on {args.device}: {err}")
        names = ", ".join(c.name for c in codecs)
        print(f"PASS {args.engine} engine ({names}) on {args.device}: registered={engine.registered}, "
              f"{engine.batches} batches, {time.perf_counter() - t0:.1f} s")  # fmt: skip
    finally:
        engine.close()


if __name__ == "__main__":
    main()
