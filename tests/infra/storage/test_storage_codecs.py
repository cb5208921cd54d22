from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.infra.storage.codecs import ERR_CHECKSUM, ERR_CORRUPT, Codec, Op, run_jobs
from carina.infra.storage.zvc import zvc_compress, zvc_decompress
from carina.infra.storage.zvcbatch import run_zvc_jobs

B = 64 << 10


def _arena(blocks: list[bytes]) -> memoryview:
    arena = memoryview(bytearray(B * 2 * (len(blocks) + 1)))
    for i, blk in enumerate(blocks):
        arena[i * B : i * B + len(blk)] = blk
    return arena


def _round_trip(codec: Codec, blocks: list[bytes]) -> list[tuple[int, int, int]]:
    n = len(blocks)
    arena = _arena(blocks)
    out_base = n * B
    results = run_jobs(arena, [(Op.COMPRESS, codec, i * B, B, out_base + i * B, B, 0) for i in range(n)])
    jobs = []
    for i, (used, clen, crc) in enumerate(results):
        if clen:
            assert zlib.crc32(arena[out_base + i * B : out_base + i * B + clen]) == crc
            jobs.append((Op.DECOMPRESS, used, out_base + i * B, clen, i * B, B, crc))
    arena[: n * B] = bytes(n * B)  # decompression must restore every non-zero block
    assert all(r[1] == B for r in run_jobs(arena, jobs))
    for i, blk in enumerate(blocks):
        if results[i][1]:
            assert bytes(arena[i * B : (i + 1) * B]) == blk
    return results


@pytest.mark.parametrize("codec", list(Codec))
def test_codecs_round_trip_and_fall_back(codec: Codec) -> None:
    text = (b"the quick brown fox jumps over the lazy dog " * 2000)[:B]
    noise = os.urandom(B)
    sparse = bytearray(B)
    sparse[1000:1100] = os.urandom(100)
    results = _round_trip(codec, [text, noise, bytes(sparse), bytes(B)])
    assert results[1][0] == Codec.RAW and results[1][1] == B  # incompressible: stored raw
    assert results[3][1] == 0  # all zero: a hole, nothing stored
    assert results[2][1] < B // 4 if codec != Codec.RAW else results[2][1] == B
    if codec in (Codec.LZ4, Codec.ZSTD, Codec.ZLIB, Codec.DEFLATE):
        assert results[0][0] == codec and results[0][1] < B // 10


@pytest.mark.parametrize("codec", [Codec.LZ4, Codec.ZSTD, Codec.ZLIB, Codec.DEFLATE, Codec.ZVC])
def test_decompress_detects_checksum_and_corruption(codec: Codec) -> None:
    sparse = bytearray(B)
    sparse[::97] = b"x" * len(sparse[::97])
    arena = _arena([bytes(sparse)])
    (used, clen, crc) = run_jobs(arena, [(Op.COMPRESS, codec, 0, B, B, B, 0)])[0]
    assert used == codec
    assert run_jobs(arena, [(Op.DECOMPRESS, used, B, clen, 2 * B, B, crc ^ 1)])[0][1] == ERR_CHECKSUM
    arena[B : B + 8] = b"\xff" * 8
    bad_crc = zlib.crc32(arena[B : B + clen])
    assert run_jobs(arena, [(Op.DECOMPRESS, used, B, clen, 2 * B, B, bad_crc)])[0][1] in (ERR_CORRUPT, B)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.floats(0, 1), st.integers(0, 2**32 - 1))
def test_zvc_torch_kernels_invert(n: int, density: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    length = 512
    data = rng.integers(1, 256, size=(n, length), dtype=np.uint8) * (rng.random((n, length)) < density)
    blocks = torch.from_numpy(data.astype(np.uint8))
    bitmaps, counts, values = zvc_compress(blocks)
    assert counts.tolist() == (data != 0).sum(1).tolist()
    assert torch.equal(zvc_decompress(bitmaps, values), blocks)


def test_zvc_jobs_match_between_batched_and_single() -> None:
    rng = np.random.default_rng(0)
    blocks = [bytes((rng.integers(0, 256, B) * (rng.random(B) < d)).astype(np.uint8)) for d in (0.05, 0.3, 0.9)]
    arena = _arena(blocks)
    jobs = [(Op.COMPRESS, Codec.ZVC, i * B, B, (3 + i) * B, B, 0) for i in range(3)]
    batched = run_zvc_jobs(arena, jobs)
    single = [run_zvc_jobs(arena, [j])[0] for j in jobs]
    assert batched == single
    assert [r[0] for r in batched] == [Codec.ZVC, Codec.ZVC, Codec.RAW]
