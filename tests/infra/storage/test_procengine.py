"""The process engine's channel format: packed jobs and results, reassembled across reads."""

from __future__ import annotations

import asyncio
import random
import zlib

import pytest

from carina.core.errors import IOEngineError
from carina.infra.storage.codecs import Codec, Op
from carina.infra.storage.procengine import ProcessEngine, _Frames, pack_jobs, pack_results

B = 4096


def test_messages_split_anywhere_come_back_whole_and_in_order() -> None:
    jobs = [(Op.COMPRESS, Codec.ZLIB, i * B, B, (1 << 40) + i, B, 0xFFFFFFFF - i) for i in range(50)]
    results = [(int(Codec.RAW), -2, 7), (int(Codec.LZ4), 123, 0xDEADBEEF)]
    stream = pack_jobs(3, jobs[:1]) + pack_jobs(4, jobs) + pack_jobs(5, [])
    back = pack_results(9, results) + pack_results(10, ValueError("bad codec 99"))
    rng = random.Random(12)
    for data, width, want in (
        (stream, 7, [(3, jobs[:1]), (4, jobs), (5, [])]),
        (back, 3, [(9, results), (10, "ValueError('bad codec 99')")]),
    ):
        for _ in range(20):  # cut the stream at random places, as reads of a busy channel do
            cuts = sorted(rng.sample(range(1, len(data)), 5))
            frames, got = _Frames(width), []
            for lo, hi in zip([0, *cuts], [*cuts, len(data)], strict=True):
                got += frames.feed(data[lo:hi])
            assert got == [(bid, list(items) if isinstance(items, list) else items) for bid, items in want]
            assert not frames.buf


def test_a_failing_job_fails_its_request_and_the_worker_keeps_serving() -> None:
    pool = ProcessEngine(4 * B, workers=1)
    try:
        payload = (b"worker channel " * 400)[:B]
        pool.arena.view[:B] = payload

        async def go() -> tuple[int, list[tuple[int, int, int]]]:
            with pytest.raises(IOEngineError, match=r"codec worker failed: .*99"):
                await pool.run([(Op.COMPRESS, 99, 0, B, B, B, 0)])  # no codec 99
            ((codec, n, crc),) = await pool.run([(Op.COMPRESS, Codec.ZLIB, 0, B, B, B, 0)])
            assert codec == Codec.ZLIB and 0 < n < B
            stored = zlib.compress(payload, 1)
            assert bytes(pool.arena.view[B : B + n]) == stored and crc == zlib.crc32(stored)
            return crc, await pool.run([(Op.DECOMPRESS, codec, B, n, 2 * B, B, crc)])

        crc, back = asyncio.run(go())
        assert back == [(Codec.ZLIB, B, crc)] and bytes(pool.arena.view[2 * B : 3 * B]) == payload
    finally:
        pool.close()
