"""The nvcomp engine's batching on the CPU: the real batcher and engine, nvCOMP replaced by a named CPU stand-in.

What runs here is everything but nvCOMP's kernels: the plan (which jobs the
device takes), one group per operation/codec/block length, gathering scattered
request blocks into one upload, holes, the raw fallback, device-side CRC
checks, the CPU redo of a group the codec rejects, and the reasons the engine
gives where nvCOMP cannot run. Its speed is measured only on a GPU (h200.sh).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import zlib

import pytest

from carina.core.errors import BackendUnavailable
from carina.infra.storage.codecs import ERR_CHECKSUM, Codec, Op, run_jobs
from carina.infra.storage.config import EngineConfig, EngineKind
from carina.infra.storage.engines import InlineEngine, build_engine
from carina.infra.storage.nvcomp_engine import NvcompEngine, nvcomp_reasons
from carina.testing.batchcodec import CpuStandInBatchCodec

B = 4 << 10


def _blocks() -> list[bytes]:
    text = (b"nvcomp batches the blocks of many requests " * 200)[:B]
    sparse = bytearray(B)
    sparse[::61] = b"\x05" * len(sparse[::61])
    return [text, os.urandom(B), bytes(sparse), bytes(B)] * 3


async def _one_submit_per_request(engine, jobs) -> list:
    return [r[0] for r in await asyncio.gather(*(engine.run([job]) for job in jobs))]


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD, Codec.DEFLATE])
def test_stand_in_batches_store_what_the_cpu_codecs_read_back(codec: Codec) -> None:
    blocks = _blocks()
    n = len(blocks)
    stand_in = CpuStandInBatchCodec()
    engine = NvcompEngine(8 * n * B, device="cpu", workers=1, codec=codec, batch_codec=stand_in)
    inline = InlineEngine(8 * n * B)
    try:
        for e in (engine, inline):
            for i, blk in enumerate(blocks):  # every other block: the requests' blocks are scattered
                e.arena.view[2 * i * B : (2 * i + 1) * B] = blk
        jobs = [(Op.COMPRESS, codec, 2 * i * B, B, (2 * n + 2 * i) * B, B, 0) for i in range(n)]
        got = asyncio.run(_one_submit_per_request(engine, jobs))
        assert got == asyncio.run(_one_submit_per_request(inline, jobs))  # same codec, hole and raw rules
        assert engine.batches == 1 and stand_in.calls == 1  # twelve requests, one batch, one codec call
        stored = engine.arena.view
        for i, (_, clen, crc) in enumerate(got):
            assert zlib.crc32(stored[(2 * n + 2 * i) * B : (2 * n + 2 * i) * B + clen]) == crc
        back = [(Op.DECOMPRESS, used, (2 * n + 2 * i) * B, clen, (4 * n + i) * B, B, crc)
                for i, (used, clen, crc) in enumerate(got) if clen]  # fmt: skip
        res = asyncio.run(_one_submit_per_request(engine, back))
        assert [r[1] for r in res] == [B] * len(back) and stand_in.calls == 2
        for i, (_, clen, _) in enumerate(got):
            if clen:
                assert bytes(stored[(4 * n + i) * B : (4 * n + i + 1) * B]) == blocks[i]
        cpu = run_jobs(inline.arena.view, back)  # the CPU engines read what the batched codec stored
        assert [r[1] for r in cpu] == [B] * len(back)
    finally:
        engine.close()
        inline.close()


def test_bad_checksum_and_rejected_groups_give_exact_errors() -> None:
    stand_in = CpuStandInBatchCodec()
    engine = NvcompEngine(16 * B, device="cpu", workers=1, batch_codec=stand_in)
    try:
        text = (b"checksums before codecs " * 300)[:B]
        engine.arena.view[:B] = text
        ((used, clen, crc),) = asyncio.run(engine.run([(Op.COMPRESS, Codec.LZ4, 0, B, B, B, 0)]))
        assert used == Codec.LZ4 and 0 < clen < B
        jobs = [(Op.DECOMPRESS, used, B, clen, 2 * B, B, crc), (Op.DECOMPRESS, used, B, clen, 3 * B, B, crc ^ 1)]
        good, bad = asyncio.run(engine.run(jobs))
        assert good == (Codec.LZ4, B, crc) and bad[1] == ERR_CHECKSUM
        assert bytes(engine.arena.view[2 * B : 3 * B]) == text and not any(engine.arena.view[3 * B : 4 * B])
        stand_in.reject = True  # a device codec that throws: the CPU redoes the group and says which block failed
        good, bad = asyncio.run(engine.run(jobs))
        assert good == (Codec.LZ4, B, crc) and bad[1] == ERR_CHECKSUM and engine._batcher.fallbacks == 1
    finally:
        engine.close()


def test_gated_batches_take_what_arrived_while_one_was_in_flight() -> None:
    stand_in = CpuStandInBatchCodec()
    engine = NvcompEngine(64 * B, device="cpu", workers=1, batch_codec=stand_in)
    text = (b"gather while the device is busy " * 200)[:B]
    try:
        for i in range(8):
            engine.arena.view[i * B : (i + 1) * B] = text

        async def go() -> list:
            first = asyncio.ensure_future(engine.run([(Op.COMPRESS, Codec.ZSTD, 0, B, 16 * B, B, 0)]))
            await asyncio.sleep(0)  # the first batch is launched: the engine is full (one launch thread)
            rest = [engine.run([(Op.COMPRESS, Codec.ZSTD, i * B, B, (16 + i) * B, B, 0)]) for i in range(1, 8)]
            for _ in range(3):
                await asyncio.sleep(0)  # later loop turns: still one batch in flight, the seven wait together
            assert engine.batches == 1
            return [await first, *await asyncio.gather(*rest)]

        got = asyncio.run(go())
        assert engine.batches == 2 and engine.jobs == 8 and len({r[0] for r in got}) == 1
    finally:
        engine.close()


def test_nvcomp_reasons_name_what_is_missing() -> None:
    reasons = nvcomp_reasons("cpu", Codec.ZLIB)
    assert any("CUDA devices only" in r for r in reasons)
    assert any("no zlib codec" in r for r in reasons)
    import importlib.util

    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.nvcomp") is None:
        assert any("pip install nvidia-nvcomp-cu" in r for r in reasons)
    with pytest.raises(BackendUnavailable, match="nvcomp engine cannot run here"):
        build_engine(EngineConfig(kind=EngineKind.NVCOMP, device="cpu"), arena_bytes=B, codec=Codec.LZ4)
    engine = NvcompEngine(B, device="cpu", batch_codec=CpuStandInBatchCodec())
    try:
        assert engine.unsupported_reasons(Codec.ZVC) and not engine.unsupported_reasons(Codec.DEFLATE)
    finally:
        engine.close()


class _ThreadRecordingStandIn(CpuStandInBatchCodec):
    """The stand-in, noting which thread made each call, its operation and row length."""

    def __init__(self, *, garble: bool = False) -> None:
        super().__init__()
        self.garble = garble
        self.seen: list[tuple[int, str, int]] = []

    def encode(self, rows, codec, stream):
        self.seen.append((threading.get_ident(), "encode", rows.shape[1]))
        return super().encode(rows, codec, stream)

    def decode(self, rows, sizes, codec, stream):
        self.seen.append((threading.get_ident(), "decode", rows.shape[1]))
        blocks, got = super().decode(rows, sizes, codec, stream)
        if self.garble:  # right sizes, wrong bytes: what the warm-up's comparison must catch
            blocks[:, 0] ^= 0xFF
        return blocks, got


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.DEFLATE], ids=["lz4", "deflate"])
def test_prepare_runs_the_codec_on_every_launch_thread(codec: Codec) -> None:
    """Session 12: the engine inherited a prepare that only captured graphs (it has none), so it did nothing."""
    stand_in = _ThreadRecordingStandIn()
    engine = NvcompEngine(64 * B, device="cpu", workers=2, codec=codec, batch_codec=stand_in)
    try:
        engine.prepare(B, codec)
        threads = {t for t, _, _ in stand_in.seen}
        assert len(threads) == 2 and threading.get_ident() not in threads  # each launch thread, not the caller
        for t in threads:
            assert {(op, n) for u, op, n in stand_in.seen if u == t} == {("encode", B), ("decode", B)}
        assert engine.prepared_for == (B, codec)
        # prepared, the engine still serves: a request after the warm-up round-trips
        text = (b"served after the warm-up " * 200)[:B]
        engine.arena.view[32 * B : 33 * B] = text
        ((used, clen, crc),) = asyncio.run(engine.run([(Op.COMPRESS, codec, 32 * B, B, 33 * B, B, 0)]))
        asyncio.run(engine.run([(Op.DECOMPRESS, used, 33 * B, clen, 34 * B, B, crc)]))
        assert bytes(engine.arena.view[34 * B : 35 * B]) == text
    finally:
        engine.close()


class _OverlapRecordingStandIn(_ThreadRecordingStandIn):
    """The stand-in, counting how many launch threads are inside a codec call at once."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.most = 0, 0
        self._lock = threading.Lock()

    def encode(self, rows, codec, stream):
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.05)  # room for another thread to come in, were the warm-ups concurrent
        try:
            return super().encode(rows, codec, stream)
        finally:
            with self._lock:
                self.inside -= 1


def test_launch_threads_prepare_one_at_a_time() -> None:
    """s14 H100: two launch threads capturing at once invalidated a capture; the warm-ups now take turns."""
    stand_in = _OverlapRecordingStandIn()
    engine = NvcompEngine(64 * B, device="cpu", workers=3, codec=Codec.LZ4, batch_codec=stand_in)
    try:
        engine.prepare(B, Codec.LZ4)
        assert len({t for t, _, _ in stand_in.seen}) == 3  # still every launch thread, each once
        assert stand_in.most == 1
    finally:
        engine.close()


def test_prepare_refuses_an_engine_whose_round_trip_is_wrong() -> None:
    engine = NvcompEngine(64 * B, device="cpu", workers=1, batch_codec=_ThreadRecordingStandIn(garble=True))
    try:
        with pytest.raises(BackendUnavailable, match="warm-up round trip"):
            engine.prepare(B, Codec.LZ4)
    finally:
        engine.close()
