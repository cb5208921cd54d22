"""Pinned staging (run on CPU tensors: the same code the CUDA path uses)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.io import IOConfig, IOEngine
from carina.io._staging import StagingArena

torch = pytest.importorskip("torch")


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 20_000), min_size=1, max_size=20), order=st.randoms())
def test_arena_blocks_are_aligned_disjoint_and_fully_returned(sizes: list[int], order: object) -> None:
    arena = StagingArena(64 << 10, alignment=4096)
    taken = [(arena.alloc(n), n) for n in sizes]
    spans = []
    for (tensor, block), n in taken:
        assert tensor.numel() == n and tensor.data_ptr() % 4096 == 0
        if block is not None:
            spans.append(block)
    spans.sort()
    assert all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert arena.overflows == len(sizes) - len(spans)
    order.shuffle(taken)  # type: ignore[attr-defined]
    for (_, block), _ in taken:
        arena.free(block)
    assert arena.used == 0 and arena._free == [(0, 64 << 10)]


def test_staged_round_trip_of_a_bf16_tensor(tmp_path: Path) -> None:
    src = torch.randn(3000, dtype=torch.bfloat16)
    with IOEngine(IOConfig(bounce_bytes=1 << 16)) as eng:
        h = eng.open(tmp_path / "t.bin", "w")
        assert eng.write_staged(h, 4096, src).result(10) == 6000
        dst = torch.empty_like(src)
        fut = eng.read_staged(h, 4096, dst)
        assert fut.result(10) == 6000
        fut.stream_wait()  # CPU: nothing to wait for once done
        assert torch.equal(dst, src)
        assert eng._staging.used == 0


def test_staged_read_error_frees_its_block(tmp_path: Path) -> None:
    (tmp_path / "s.bin").write_bytes(b"z" * 100)
    with IOEngine(IOConfig(bounce_bytes=1 << 16)) as eng:
        h = eng.open(tmp_path / "s.bin", "r")
        with pytest.raises(Exception, match="end of file"):
            eng.read_staged(h, 0, torch.empty(200, dtype=torch.uint8)).result(10)
        assert eng._staging.used == 0
