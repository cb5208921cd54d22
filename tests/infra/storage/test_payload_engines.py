from __future__ import annotations

import asyncio
import os

import pytest

from carina.core.errors import BackendUnavailable, ConfigError, IOEngineError
from carina.infra.storage.codecs import Codec, Op
from carina.infra.storage.config import EngineConfig, EngineKind, Overflow
from carina.infra.storage.enginebase import _split
from carina.infra.storage.engines import InlineEngine, ThreadEngine, build_engine
from carina.infra.storage.procengine import ProcessEngine
from carina.infra.storage.torch_engine import TorchEngine

B = 16 << 10


def _fill(engine, blocks: list[bytes]) -> None:
    for i, blk in enumerate(blocks):
        engine.arena.view[i * B : (i + 1) * B] = blk


def _blocks() -> list[bytes]:
    text = (b"carina storage tier " * 1000)[:B]
    sparse = bytearray(B)
    sparse[::50] = b"\x07" * len(sparse[::50])
    return [text, os.urandom(B), bytes(sparse), bytes(B)] * 4


async def _compress_in_many_submits(engine, n: int, codec: Codec) -> list[list[tuple[int, int, int]]]:
    # one submit per block, all in the same loop turn: the engine must coalesce and split them back
    subs = [engine.run([(Op.COMPRESS, codec, i * B, B, (n + i) * B, B, 0)]) for i in range(n)]
    return await asyncio.gather(*subs)


def _decompress_back(pool, got: list[list[tuple[int, int, int]]], blocks: list[bytes]) -> None:
    """Decompress what ``pool`` compressed (results ``got``) into a third region; every block comes back."""
    n = len(blocks)
    flat = [res[0] for res in got]
    back = [(Op.DECOMPRESS, c, (n + i) * B, ln, (2 * n + i) * B, B, crc) for i, (c, ln, crc) in enumerate(flat)]
    back = [job for job in back if job[3]]
    assert [ln for _, ln, _ in asyncio.run(pool.run(back))] == [B] * len(back) and len(back) == 12
    for i, (_, ln, _) in enumerate(flat):
        if ln:
            assert bytes(pool.arena.view[(2 * n + i) * B : (2 * n + i + 1) * B]) == blocks[i]


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD])
def test_process_pool_matches_inline_and_coalesces(codec: Codec) -> None:
    blocks = _blocks()
    n = len(blocks)
    inline, pool = InlineEngine(4 * n * B), ProcessEngine(4 * n * B, workers=2)
    try:
        for engine in (inline, pool):
            _fill(engine, blocks)
        ref = asyncio.run(_compress_in_many_submits(inline, n, codec))
        got = asyncio.run(_compress_in_many_submits(pool, n, codec))
        assert got == ref
        assert pool.batches == 1 and pool.jobs == n
        assert bytes(pool.arena.view[n * B : 2 * n * B]) == bytes(inline.arena.view[n * B : 2 * n * B])
    finally:
        inline.close()
        pool.close()


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD, Codec.ZLIB])
def test_thread_pool_matches_inline_round_trip(codec: Codec) -> None:
    blocks = _blocks()
    n = len(blocks)
    inline, pool = InlineEngine(4 * n * B), ThreadEngine(4 * n * B, workers=3)
    try:
        for engine in (inline, pool):
            _fill(engine, blocks)
        ref = asyncio.run(_compress_in_many_submits(inline, n, codec))
        got = asyncio.run(_compress_in_many_submits(pool, n, codec))
        assert got == ref and pool.batches == 1 and pool.jobs == n
        assert bytes(pool.arena.view[n * B : 2 * n * B]) == bytes(inline.arena.view[n * B : 2 * n * B])
        _decompress_back(pool, got, blocks)
    finally:
        inline.close()
        pool.close()


@pytest.mark.parametrize("kind", [EngineKind.THREAD, EngineKind.PROCESS])
def test_loop_overflow_runs_what_no_idle_worker_takes(kind: EngineKind) -> None:
    blocks = _blocks()
    n = len(blocks)
    inline = InlineEngine(4 * n * B)
    cfg = EngineConfig(kind=kind, workers=1, overflow=Overflow.LOOP)
    pool = build_engine(cfg, arena_bytes=4 * n * B, codec=Codec.ZLIB)
    try:
        for engine in (inline, pool):
            _fill(engine, blocks)
        ref = asyncio.run(_compress_in_many_submits(inline, n, Codec.ZLIB))
        got = asyncio.run(_compress_in_many_submits(pool, n, Codec.ZLIB))
        assert got == ref
        assert bytes(pool.arena.view[n * B : 2 * n * B]) == bytes(inline.arena.view[n * B : 2 * n * B])
        # one loop turn, one idle worker: the worker gets half the jobs, the loop runs the other half itself
        assert pool.batches == 1 and pool.jobs == n and pool.loop_pieces == 1
        _decompress_back(pool, got, blocks)
    finally:
        inline.close()
        pool.close()


@pytest.mark.parametrize("kind", [EngineKind.THREAD, EngineKind.PROCESS])
def test_small_and_raw_decompressions_stay_in_the_event_loop(kind: EngineKind) -> None:
    blocks = _blocks()
    n = len(blocks)
    engines = {below: build_engine(EngineConfig(kind=kind, workers=1, loop_below=below), arena_bytes=4 * n * B,
                                   codec=Codec.ZLIB) for below in (2 * B, 1, 0)}  # fmt: skip
    try:
        for below, pool in engines.items():
            _fill(pool, blocks)
            got = asyncio.run(_compress_in_many_submits(pool, n, Codec.ZLIB))
            assert pool.batches == 1 and pool.loop_pieces == 0  # compressions always go to the worker
            _decompress_back(pool, got, blocks)  # bit-exact wherever it ran
            assert (pool.batches, pool.loop_pieces) == ((1, 1) if below == 2 * B else (2, 0))
            raw = [(Op.DECOMPRESS, c, (n + i) * B, ln, (2 * n + i) * B, B, crc)
                   for i, [(c, ln, crc)] in enumerate(got) if c == Codec.RAW and ln]  # fmt: skip
            assert len(raw) == 4 and [r[1] for r in asyncio.run(pool.run(raw))] == [B] * 4
            assert pool.loop_pieces == (0 if below == 0 else 1 + (below == 2 * B))  # raw copies: here unless 0
            for i in range(1, n, 4):  # the random blocks, copied back from their raw stored bytes
                assert bytes(pool.arena.view[(2 * n + i) * B : (2 * n + i + 1) * B]) == blocks[i]
    finally:
        for pool in engines.values():
            pool.close()


def test_loop_overflow_is_only_for_the_cpu_pools() -> None:
    with pytest.raises(ConfigError, match="overflow"):
        EngineConfig(kind=EngineKind.INLINE, overflow=Overflow.LOOP)
    queue = ThreadEngine(4 * B, workers=1)
    try:
        asyncio.run(queue.run([(Op.COMPRESS, Codec.ZLIB, 0, B, B, B, 0), (Op.COMPRESS, Codec.ZLIB, 0, B, 2 * B, B, 0)]))
        assert queue.loop_pieces == 0 and queue.batches == 1
    finally:
        queue.close()


def test_split_cuts_batches_into_worker_pieces() -> None:
    assert _split(16, 3, 1) == [(0, 6), (6, 12), (12, 16)]
    assert _split(3, 8, 2) == [(0, 3)]
    assert _split(1, 4, 1) == [(0, 1)]


def test_torch_engine_on_cpu_matches_the_inline_zvc_path() -> None:
    blocks = _blocks()
    n = len(blocks)
    inline, torch_engine = InlineEngine(4 * n * B), TorchEngine(4 * n * B, device="cpu")
    try:
        for engine in (inline, torch_engine):
            _fill(engine, blocks)
        assert asyncio.run(_compress_in_many_submits(torch_engine, n, Codec.ZVC)) == asyncio.run(
            _compress_in_many_submits(inline, n, Codec.ZVC)
        )
    finally:
        inline.close()
        torch_engine.close()


def test_dead_worker_fails_requests_instead_of_hanging() -> None:
    pool = ProcessEngine(4 * B, workers=1)
    try:
        pool._procs[0].kill()
        pool._procs[0].join()

        async def go() -> None:
            await asyncio.wait_for(pool.run([(Op.COMPRESS, Codec.LZ4, 0, B, B, B, 0)]), 30)

        with pytest.raises((IOEngineError, OSError)):
            asyncio.run(go())
    finally:
        pool.close()


def test_build_engine_refuses_codecs_an_engine_cannot_run() -> None:
    with pytest.raises(BackendUnavailable, match="no lz4 kernel"):
        build_engine(EngineConfig(kind=EngineKind.TORCH, device="cpu"), arena_bytes=B, codec=Codec.LZ4)
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailable, match="CUDA"):
            TorchEngine(B, device="cuda")


def test_a_request_completes_with_its_own_piece_not_the_whole_batch() -> None:
    """No lockstep: requests in a finished piece resume while another piece of the same turn still runs."""
    from carina.infra.storage.engines import Arena, PayloadEngine

    class Manual(PayloadEngine):
        pieces = 2

        def __init__(self) -> None:
            super().__init__(Arena(1 << 16))
            self.launched: list[tuple[list, object]] = []

        def _launch(self, jobs, done) -> None:  # type: ignore[no-untyped-def]
            self.launched.append((jobs, done))

    async def go() -> None:
        engine = Manual()
        job = (Op.COMPRESS, Codec.RAW, 0, 8, 8, 8, 0)
        first = asyncio.ensure_future(engine.run([job, job]))
        second = asyncio.ensure_future(engine.run([job, job]))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [len(jobs) for jobs, _ in engine.launched] == [2, 2] and engine.batches == 1
        engine.launched[1][1]([(0, 8, 1), (0, 8, 2)])  # second piece finishes first
        await asyncio.sleep(0)
        assert second.done() and not first.done()
        assert second.result() == [(0, 8, 1), (0, 8, 2)]
        engine.launched[0][1]([(0, 8, 3), (0, 8, 4)])
        assert await first == [(0, 8, 3), (0, 8, 4)]
        engine.close()

    asyncio.run(go())


def test_pieces_hold_at_least_min_piece_bytes_of_payload() -> None:
    from carina.infra.storage.engines import Arena, PayloadEngine

    class Manual(PayloadEngine):
        pieces = 4
        min_piece_bytes = 4 * B

        def __init__(self) -> None:
            super().__init__(Arena(1 << 16))
            self.sizes: list[int] = []

        def _launch(self, jobs, done) -> None:  # type: ignore[no-untyped-def]
            self.sizes.append(len(jobs))
            done([(0, 0, 0)] * len(jobs))

    async def go(engine: Manual, n: int) -> None:
        await asyncio.gather(*(engine.run([(Op.COMPRESS, Codec.RAW, 0, B, B, B, 0)]) for _ in range(n)))

    engine = Manual()
    asyncio.run(go(engine, 6))  # 6 blocks: one piece (two would hold fewer than 4 blocks each)
    asyncio.run(go(engine, 16))  # 16 blocks: four pieces of four
    assert engine.sizes == [6, 4, 4, 4, 4]
    engine.close()


def test_gated_process_pool_under_uvloop_takes_batches_larger_than_a_socket_buffer() -> None:
    # uvloop sets watched fds non-blocking; a gated pool sends batches of thousands of jobs (replies > 64 KiB)
    uvloop = pytest.importorskip("uvloop")
    n = 3000
    pool = ProcessEngine(2 * n * 512, workers=1, max_inflight=1)
    try:
        view = pool.arena.view
        for i in range(n):
            view[i * 512 : (i + 1) * 512] = ((b"%06d uvloop batch " % i) * 30)[:512]

        async def go() -> list:
            first = pool.run([(Op.COMPRESS, Codec.ZLIB, 0, 512, n * 512, 512, 0)])
            rest = [pool.run([(Op.COMPRESS, Codec.ZLIB, i * 512, 512, (n + i) * 512, 512, 0)]) for i in range(1, n)]
            return await asyncio.gather(first, *rest)

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            got = runner.run(go())
        assert pool.batches == 1 and [r[0][0] for r in got] == [Codec.ZLIB] * n  # 3000 requests, one batch
        assert pool._next_id == 3  # sent as pieces of at most 1024 jobs
        assert len({r[0][1] for r in got}) > 1
    finally:
        pool.close()
