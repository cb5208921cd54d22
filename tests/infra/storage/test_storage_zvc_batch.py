"""The batched ZVC path (device-side packing, decoding and CRC-32), run on the CPU with the same code as on a GPU."""

from __future__ import annotations

import asyncio
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.infra.storage.codecs import ERR_CHECKSUM, ERR_CORRUPT, Codec, Op, run_jobs
from carina.infra.storage.crc import RowCrc32, row_crc32
from carina.infra.storage.engines import InlineEngine
from carina.infra.storage.rowcopy import runs_of as _runs
from carina.infra.storage.torch_engine import TorchEngine
from carina.infra.storage.zvc import zvc_compress
from carina.infra.storage.zvcbatch import ZvcBatcher


@pytest.mark.parametrize("length", [8, 24, 512, 4096, 8208, 65536])
def test_row_crc32_equals_zlib_for_every_prefix_length(length: int) -> None:
    rng = np.random.default_rng(length)
    n = 6
    rows = rng.integers(0, 256, size=(n, length), dtype=np.uint8)
    lengths = np.array([length, 0, 1, length // 2, length - 1, 7])
    for i, s in enumerate(lengths):
        rows[i, s:] = 0  # bytes past a row's length are zero, as the callers guarantee
    got = RowCrc32(length, "cpu")(torch.from_numpy(rows), torch.from_numpy(lengths)).tolist()
    assert got == [zlib.crc32(rows[i, :s].tobytes()) for i, s in enumerate(lengths)]


def test_row_crc32_is_cached_and_rejects_other_lengths() -> None:
    assert row_crc32(64, "cpu") is row_crc32(64, "cpu")
    with pytest.raises(ValueError, match="rows of 128 bytes"):
        row_crc32(64, "cpu")(torch.zeros((1, 128), dtype=torch.uint8), torch.zeros(1, dtype=torch.int64))


def _block(rng: np.random.Generator, length: int, density: float) -> bytes:
    return bytes((rng.integers(1, 256, length) * (rng.random(length) < density)).astype(np.uint8))


def _reference(block: bytes) -> tuple[int, bytes]:
    """What a ZVC block is stored as: hole, raw, or bitmap + non-zero bytes (from the flat kernels)."""
    rows = torch.frombuffer(bytearray(block), dtype=torch.uint8).view(1, -1)
    bitmaps, counts, values = zvc_compress(rows)
    if int(counts[0]) == 0:
        return Codec.RAW, b""
    packed = bitmaps.numpy().tobytes() + values.numpy().tobytes()
    return (Codec.ZVC, packed) if len(packed) < len(block) else (Codec.RAW, block)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12), st.integers(0, 2**32 - 1), st.booleans())
def test_batched_round_trip_is_bit_exact_with_scattered_offsets(densities: list[float], seed: int, mix: bool) -> None:
    rng = np.random.default_rng(seed)
    lengths = [512 if mix and i % 3 == 0 else 1024 for i in range(len(densities))]
    blocks = [_block(rng, ln, d) for ln, d in zip(lengths, densities, strict=True)]
    slot = 1024
    n = len(blocks)
    arena = memoryview(bytearray(3 * n * slot + 4096))
    order = rng.permutation(n)  # destinations out of order: runs break up
    for i, blk in enumerate(blocks):
        arena[i * slot : i * slot + len(blk)] = blk
    jobs = [(Op.COMPRESS, Codec.ZVC, i * slot, ln, (n + int(order[i])) * slot, slot, 0) for i, ln in enumerate(lengths)]
    results = ZvcBatcher(arena, "cpu").run(jobs)
    back = []
    for i, (codec, size, crc) in enumerate(results):
        want_codec, want = _reference(blocks[i])
        dst = (n + int(order[i])) * slot
        assert (codec, bytes(arena[dst : dst + size])) == (want_codec, want)
        assert crc == (zlib.crc32(want) if size else 0)
        if size:
            back.append((Op.DECOMPRESS, codec, dst, size, (2 * n + i) * slot, lengths[i], crc))
    out = ZvcBatcher(arena, "cpu", raw_reads=True).run(back)
    assert [r[1] for r in out] == [job[5] for job in back]
    for job in back:
        i = job[4] // slot - 2 * n
        assert bytes(arena[job[4] : job[4] + lengths[i]]) == blocks[i]


def test_batched_decompress_flags_bad_checksums_bitmaps_and_lengths() -> None:
    rng = np.random.default_rng(7)
    b = 4096
    arena = memoryview(bytearray(16 * b))
    arena[0:b] = _block(rng, b, 0.2)
    arena[b : 2 * b] = _block(rng, b, 1.0)
    (zc, zlen, zcrc), (rc, rlen, rcrc) = ZvcBatcher(arena, "cpu").run(
        [(Op.COMPRESS, Codec.ZVC, 0, b, 4 * b, b, 0), (Op.COMPRESS, Codec.ZVC, b, b, 5 * b, b, 0)]
    )
    assert (zc, rc, rlen) == (Codec.ZVC, Codec.RAW, b)
    arena[6 * b : 7 * b] = arena[4 * b : 5 * b]
    arena[6 * b] ^= 0x01  # one bitmap bit flipped, CRC recomputed: the checksum passes, the structure does not
    flipped_crc = zlib.crc32(arena[6 * b : 6 * b + zlen])
    jobs = [
        (Op.DECOMPRESS, Codec.ZVC, 4 * b, zlen, 8 * b, b, zcrc ^ 1),  # wrong CRC
        (Op.DECOMPRESS, Codec.ZVC, 6 * b, zlen, 9 * b, b, flipped_crc),  # bitmap disagrees with the size
        (Op.DECOMPRESS, Codec.RAW, 5 * b, rlen, 10 * b, b, rcrc),  # good raw block
        (Op.DECOMPRESS, Codec.RAW, 5 * b, rlen - 8, 11 * b, b, zlib.crc32(arena[5 * b : 6 * b - 8])),  # short raw
        (Op.COMPRESS, Codec.ZVC, 0, 100, 12 * b, b, 0),  # a length ZVC cannot encode
        (Op.DECOMPRESS, Codec.ZVC, 4 * b, zlen, 15 * b, b, zcrc),  # good, and its destination is the arena's end
    ]
    got = ZvcBatcher(arena, "cpu", raw_reads=True).run(jobs)
    assert [r[1] for r in got] == [ERR_CHECKSUM, ERR_CORRUPT, b, ERR_CORRUPT, ERR_CORRUPT, b]
    assert got[-1] == (Codec.ZVC, b, zcrc) and bytes(arena[15 * b :]) == bytes(arena[0:b])
    assert bytes(arena[10 * b : 11 * b]) == bytes(arena[b : 2 * b])
    assert got[3] == run_jobs(arena, [jobs[3]])[0]  # a raw block of the wrong length takes the CPU path


def test_source_rows_past_the_arena_end_are_zero_padded() -> None:
    b = 512
    arena = memoryview(bytearray(3 * b))
    block = bytes(i if i % 3 == 0 else 0 for i in range(256)) * 2
    arena[0:b] = block
    (codec, size, crc) = ZvcBatcher(arena, "cpu").run([(Op.COMPRESS, Codec.ZVC, 0, b, b, b, 0)])[0]
    assert codec == Codec.ZVC and size < b
    stored = bytes(arena[b : b + size])
    arena[3 * b - size :] = stored  # stored bytes at the very end: a full-row read would run past the arena
    got = ZvcBatcher(arena, "cpu").run([(Op.DECOMPRESS, codec, 3 * b - size, size, 0, b, crc)])
    assert got == [(codec, b, crc)] and bytes(arena[0:b]) == block


def test_runs_cut_where_blocks_stop_being_back_to_back() -> None:
    src = np.array([0, 8, 16, 40, 48, 100])
    dst = np.array([0, 8, 16, 24, 32, 40])
    assert _runs(src, dst, 8) == [(0, 3, 0, 0), (3, 2, 40, 24), (5, 1, 100, 40)]


def test_torch_engine_with_several_launch_threads_matches_inline_both_ways() -> None:
    rng = np.random.default_rng(3)
    b, n = 4096, 24
    blocks = [_block(rng, b, d) for d in np.linspace(0, 1, n)]
    inline, engine = InlineEngine(4 * n * b), TorchEngine(4 * n * b, device="cpu", workers=3)
    engine.min_piece_bytes = 0  # cut even this small turn into three pieces, one per launch thread

    async def go(eng) -> tuple[list, list]:  # type: ignore[no-untyped-def]
        for i, blk in enumerate(blocks):
            eng.arena.view[i * b : (i + 1) * b] = blk
        subs = [eng.run([(Op.COMPRESS, Codec.ZVC, i * b, b, (n + i) * b, b, 0) for i in range(k, k + 4)])
                for k in range(0, n, 4)]  # fmt: skip
        packed = [r for part in await asyncio.gather(*subs) for r in part]
        back = [
            (Op.DECOMPRESS, c, (n + i) * b, s, (2 * n + i) * b, b, crc) for i, (c, s, crc) in enumerate(packed) if s
        ]
        return packed, await eng.run(back)

    try:
        ref, got = asyncio.run(go(inline)), asyncio.run(go(engine))
        assert got == ref and engine.batches == 2 and not engine.registered
        for i, blk in enumerate(blocks):
            if ref[0][i][1]:
                assert bytes(engine.arena.view[(2 * n + i) * b : (2 * n + i + 1) * b]) == blk
    finally:
        inline.close()
        engine.close()


def test_graph_buckets_and_the_eager_path_off_cuda() -> None:
    from carina.infra.storage.graphs import GraphRunner, bucket_of

    assert [bucket_of(n) for n in (1, 2, 3, 5, 8, 9, 512)] == [1, 2, 4, 8, 8, 16, 512]
    runner = GraphRunner()
    rows = torch.arange(24, dtype=torch.uint8).view(3, 8)
    (doubled,) = runner(("double", 8), lambda r: (r * 2,), (rows,), stream=None)
    assert torch.equal(doubled, rows * 2) and runner.eager == 1 and runner.replays == 0
