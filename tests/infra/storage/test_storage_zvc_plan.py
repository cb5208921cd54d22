"""The ZVC batch plan (one Python pass for small batches, numpy for large) and the batcher's host side.

Every batch is checked against the same jobs run one at a time (a batch of one takes the plan's other
branches: one group, one run), results and the whole arena bit for bit.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.infra.storage.codecs import ERR_CHECKSUM, ERR_CORRUPT, Codec, Op
from carina.infra.storage.zvcbatch import ZvcBatcher
from carina.infra.storage.zvcplan import PY_PLAN_MAX, plan_small, plan_table
from carina.infra.storage.zvcstage import LOOP_ABOVE, HostStage

SIZE = 1 << 16


def _as_lists(plan) -> list:  # type: ignore[no-untyped-def]
    groups = [(g.op, g.length, list(np.asarray(g.rows).tolist()), list(np.asarray(g.src).tolist()),
               list(np.asarray(g.dst).tolist()), list(np.asarray(g.meta).tolist()), g.src_run, g.dst_run, g.tail)
              for g in plan.groups]  # fmt: skip
    return [groups, plan.bad, plan.other]


_offset = st.sampled_from([-8, 0, 512, 4096, 8192, SIZE - 4096, SIZE - 512, SIZE - 8, SIZE])
_length = st.sampled_from([-8, 0, 8, 100, 512, 4096, 4104])
_job = st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from(list(map(int, Codec))), _offset, _length, _offset,
                 _length, st.integers(0, 2**32 - 1))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_job, max_size=40), st.booleans())
def test_the_python_pass_and_the_numpy_pass_plan_alike(jobs: list, raw_reads: bool) -> None:
    assert _as_lists(plan_small(jobs, SIZE, raw_reads=raw_reads)) == _as_lists(
        plan_table(jobs, SIZE, raw_reads=raw_reads)
    )


def test_plan_rules_runs_and_metadata() -> None:
    b = 4096
    jobs = [
        (Op.COMPRESS, Codec.ZVC, 0, b, 8 * b, b, 0),  # back to back with the next: one run both ways
        (Op.COMPRESS, Codec.ZVC, b, b, 9 * b, b, 0),
        (Op.COMPRESS, Codec.ZVC, 0, 100, 10 * b, b, 0),  # not a multiple of 8: malformed
        (Op.COMPRESS, Codec.ZVC, 0, b, 11 * b, b - 8, 0),  # destination too short: malformed
        (Op.DECOMPRESS, Codec.ZVC, 2 * b, 300, 12 * b, b, 7),
        (Op.DECOMPRESS, Codec.RAW, 3 * b, b, 13 * b, b, 9),  # raw read, taken only with raw_reads
        (Op.DECOMPRESS, Codec.RAW, 3 * b, b - 8, 14 * b, b, 9),  # raw of the wrong length: the CPU's
        (Op.COMPRESS, Codec.LZ4, 0, b, 15 * b, b, 0),  # another codec: the CPU's
        (Op.DECOMPRESS, Codec.ZVC, 2 * b, 300, SIZE - 8, b, 7),  # past the arena: malformed
        (Op.COMPRESS, Codec.ZVC, 0, 512, 4 * b, 512, 0),  # another block length: its own group
    ]
    gapped = [(Op.COMPRESS, Codec.ZVC, 0, b, 0, b, 0), (Op.COMPRESS, Codec.ZVC, 2 * b, b, b, b, 0)]
    assert _as_lists(plan_small(gapped, SIZE, raw_reads=True))[0][0][-3:] == (False, True, False)
    at_end = [(Op.DECOMPRESS, Codec.ZVC, SIZE - 300, 300, 0, b, 7)]  # a stored block ending at the arena's end
    for plan in (plan_small(at_end, SIZE, raw_reads=True), plan_table(at_end, SIZE, raw_reads=True)):
        assert plan.groups[0].tail
    for plan in (plan_small(jobs, SIZE, raw_reads=True), plan_table(jobs, SIZE, raw_reads=True)):
        got = _as_lists(plan)
        assert got[1:] == [[2, 3, 8], [6, 7]]
        assert got[0] == [
            (Op.COMPRESS, 512, [9], [0], [4 * b], [], True, True, False),
            (Op.COMPRESS, b, [0, 1], [0, b], [8 * b, 9 * b], [], True, True, False),
            (Op.DECOMPRESS, b, [4, 5], [2 * b, 3 * b], [12 * b, 13 * b], [Codec.ZVC, 300, 7, Codec.RAW, b, 9],
             True, True, False),
        ]  # fmt: skip
    assert _as_lists(plan_small(jobs, SIZE, raw_reads=False))[2] == [5, 6, 7]


def _fill(rng: np.random.Generator, arena: memoryview, slots: list[int], b: int) -> list[bytes]:
    """Blocks of every kind (sparse, dense, all zero, few non-zero) at ``slots``."""
    out = []
    for k, s in enumerate(slots):
        density = [0.1, 1.0, 0.0, 0.01, 0.5][k % 5]
        blk = bytes((rng.integers(1, 256, b) * (rng.random(b) < density)).astype(np.uint8))
        arena[s : s + b] = blk
        out.append(blk)
    return out


def _one_by_one(arena: memoryview, jobs: list) -> list:
    """The reference: each job as a batch of its own, in order."""
    return [ZvcBatcher(arena, "cpu", raw_reads=True).run([j])[0] for j in jobs]


@pytest.mark.parametrize("copies", [1, PY_PLAN_MAX // 4])  # 9 jobs (Python pass), 144 (numpy pass)
def test_a_mixed_batch_matches_its_jobs_one_by_one(copies: int) -> None:
    rng = np.random.default_rng(copies)
    b, small = 4096, 512
    slot = 8 * b
    arena = memoryview(bytearray(slot * 4 * copies + b))
    jobs, stored_jobs = [], []
    for c in range(copies):
        base = 4 * slot * c
        srcs = [base + k * slot for k in range(4)]  # one request a slot: sources and destinations not back to back
        _fill(rng, arena, srcs, b)
        _fill(rng, arena, [base + k * slot + 6 * b for k in range(4)], small)
        jobs += [(Op.COMPRESS, Codec.ZVC, s, b, s + b, b, 0) for s in srcs]
        jobs += [(Op.COMPRESS, Codec.ZVC, base + k * slot + 6 * b, small, base + k * slot + 7 * b, small, 0)
                 for k in range(2)]  # fmt: skip
        jobs += [(Op.COMPRESS, Codec.ZLIB, srcs[0], b, srcs[0] + 5 * b, b, 0), (Op.COMPRESS, Codec.ZVC, srcs[1], 100,
                 srcs[1] + 5 * b, b, 0), (Op.DECOMPRESS, Codec.ZVC, srcs[2], 8, srcs[2] + 5 * b, b, 0)]  # fmt: skip
        stored_jobs += [(s, s + b) for s in srcs]
    ref_arena = memoryview(bytearray(arena))
    got = ZvcBatcher(arena, "cpu", raw_reads=True).run(jobs)
    assert got == _one_by_one(ref_arena, jobs) and bytes(arena) == bytes(ref_arena)
    assert [r[1] for r in got].count(ERR_CORRUPT) == [r[1] for r in got].count(ERR_CHECKSUM) == copies
    assert got[6][0] == Codec.ZLIB and got[6][1] > 0
    # read back what was stored (ZVC and raw blocks), with one CRC wrong and one bitmap bit flipped
    back = []
    for i, (s, d) in enumerate(stored_jobs):
        codec, size, crc = got[(i // 4) * 9 + i % 4]
        if size:
            back.append((Op.DECOMPRESS, codec, d, size, s + 2 * b, b, crc))
    back[0] = (*back[0][:6], back[0][6] ^ 1)
    zvc = next(i for i, j in enumerate(back) if j[1] == Codec.ZVC and i > 0)
    arena[back[zvc][2]] ^= 0x01
    ref_arena[back[zvc][2]] ^= 0x01
    back[zvc] = (*back[zvc][:6], zlib.crc32(arena[back[zvc][2] : back[zvc][2] + back[zvc][3]]))
    got = ZvcBatcher(arena, "cpu", raw_reads=True).run(back)
    assert got == _one_by_one(ref_arena, back) and bytes(arena) == bytes(ref_arena)
    assert got[0][1] == ERR_CHECKSUM and got[zvc][1] == ERR_CORRUPT
    assert sum(r[1] == b for r in got) == len(back) - 2


def test_an_empty_batch_times_nothing() -> None:
    batcher = ZvcBatcher(memoryview(bytearray(4096)), "cpu")
    assert batcher.run([]) == [] and batcher.clock.report() == {}


def test_batches_of_one_shape_reuse_their_views_and_see_new_bytes() -> None:
    rng = np.random.default_rng(5)
    b, n = 4096, 6
    arena = memoryview(bytearray(4 * n * b))
    batcher = ZvcBatcher(arena, "cpu", raw_reads=True, device_crc=True)
    jobs = [(Op.COMPRESS, Codec.ZVC, 2 * i * b, b, (2 * n + i) * b, b, 0) for i in range(n)]  # gathered sources
    seen = []
    for _ in range(3):
        blocks = _fill(rng, arena, [2 * i * b for i in range(n)], b)
        ref = memoryview(bytearray(arena))
        got = batcher.run(jobs)
        assert got == _one_by_one(ref, jobs) and bytes(arena) == bytes(ref)
        kept = [i for i, r in enumerate(got) if r[1]]  # holes (all-zero blocks) are not read back
        back = [(Op.DECOMPRESS, got[i][0], (2 * n + i) * b, got[i][1], (2 * i + 1) * b, b, got[i][2]) for i in kept]
        assert len(kept) == n - 1 and [r[1] for r in batcher.run(back)] == [b] * len(kept)
        assert [bytes(arena[(2 * i + 1) * b : (2 * i + 2) * b]) for i in kept] == [blocks[i] for i in kept]
        seen.append(dict(batcher.stage._local.views))
    assert len(seen[0]) == 2 and all(v.keys() == seen[0].keys() for v in seen)  # a compress and a decompress shape
    assert all(v[k] is seen[0][k] for v in seen for k in v)  # the same views, batch after batch


@pytest.mark.parametrize("length", [512, LOOP_ABOVE * 2])
def test_gather_pads_past_the_arena_end_and_scatter_writes_exactly(length: int) -> None:
    rng = np.random.default_rng(length)
    arena = rng.integers(0, 256, 4 * length, dtype=np.uint8)
    stage = HostStage(arena, torch.from_numpy(arena))
    src = np.array([3 * length + 8, 8, length + 3])  # the first runs 8 bytes past the end; any byte offset
    out = np.full((3, length), 0xAA, dtype=np.uint8)
    stage.gather(out, list(src), length, tail=True)
    assert out[0, : length - 8].tobytes() == arena[3 * length + 8 :].tobytes() and not out[0, length - 8 :].any()
    assert (
        out[1].tobytes() == arena[8 : 8 + length].tobytes()
        and out[2].tobytes() == arena[length + 3 : 2 * length + 3].tobytes()
    )
    before = arena.copy()
    rows = rng.integers(0, 256, (2, length), dtype=np.uint8)
    stage.scatter(rows, [5, 2 * length + 1], length)
    want = before.copy()
    want[5 : 5 + length], want[2 * length + 1 : 3 * length + 1] = rows
    assert np.array_equal(arena, want)


def test_the_cuda_paths_bookkeeping_on_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branches (device buffer, copies back into staging or straight into the arena, results
    buffer, offsets of several groups in one batch) with CPU tensors standing in for the device's."""
    rng = np.random.default_rng(13)
    b, n = 4096, 8
    arena = memoryview(bytearray(6 * n * b))
    _fill(rng, arena, [i * b for i in range(n)], b)
    _fill(rng, arena, [(n + i) * b for i in range(n)], 512)
    batcher = ZvcBatcher(arena, "cpu", raw_reads=True, device_crc=True)
    monkeypatch.setattr(batcher, "_cuda", True)
    monkeypatch.setattr(batcher, "_wait", lambda: None)  # CPU tensors: every copy is done when it returns
    order = rng.permutation(n)
    for dsts in ([(2 * n + int(k)) * b for k in order], [(2 * n + i) * b for i in range(n)]):  # staged, then one run
        jobs = [(Op.COMPRESS, Codec.ZVC, i * b, b, dsts[i], b, 0) for i in range(n)]
        jobs += [(Op.COMPRESS, Codec.ZVC, (n + i) * b, 512, (3 * n + i) * b, 512, 0) for i in range(n)]
        ref = memoryview(bytearray(arena))
        copies = batcher.copies
        got = batcher.run(jobs)
        assert got == _one_by_one(ref, jobs) and bytes(arena) == bytes(ref)
        # up: one copy per group (or a read of the run); back: one copy of the rows and results of a staged group
        # (the 512-byte one, and the 4 KiB one first), two for rows straight into the arena and results apart
        run = dsts[1] - dsts[0] == b
        assert batcher.copies - copies == 2 + 1 + (2 if run else 1)
        pairs = enumerate(zip(jobs, got, strict=True))
        back = [(Op.DECOMPRESS, c, j[4], s, (4 * n + i) * b, j[5], crc) for i, (j, (c, s, crc)) in pairs if s]
        ref = memoryview(bytearray(arena))
        assert batcher.run(back) == _one_by_one(ref, back) and bytes(arena) == bytes(ref)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([8, 512, 4096]), st.lists(st.floats(0, 1), min_size=1, max_size=10), st.booleans(),
       st.booleans(), st.integers(0, 2**32 - 1))  # fmt: skip
def test_the_cuda_branch_reads_rows_and_results_back_in_one_copy_bit_for_bit(
    length: int, densities: list[float], src_run: bool, dst_run: bool, seed: int
) -> None:
    """The CUDA branch on CPU tensors (staged or straight from the arena, one copy back of the rows and results
    of a staged group, offsets in the kept buffers), batch after batch through one batcher: the same results
    and bytes as the CPU branch and as each job alone, compressing and reading back."""
    rng = np.random.default_rng(seed)
    n = len(densities)
    gap = length if src_run else 2 * length
    arena = memoryview(bytearray(n * gap + 4 * n * length))
    fake = ZvcBatcher(arena, "cpu", raw_reads=True, device_crc=True)
    fake._cuda = True  # the CUDA branch's host side, with CPU tensors for the device's
    fake._wait = lambda: None  # type: ignore[method-assign]  # CPU tensors: every copy is done when it returns
    plain_arena = memoryview(bytearray(arena))
    plain = ZvcBatcher(plain_arena, "cpu", raw_reads=True, device_crc=True)
    base = n * gap
    order = list(range(n)) if dst_run else [int(k) for k in rng.permutation(n)]
    for _ in range(2):
        blocks = [bytes((rng.integers(1, 256, length) * (rng.random(length) < d)).astype(np.uint8)) for d in densities]
        for i, blk in enumerate(blocks):
            arena[i * gap : i * gap + length] = plain_arena[i * gap : i * gap + length] = blk
        jobs = [(Op.COMPRESS, Codec.ZVC, i * gap, length, base + order[i] * length, length, 0) for i in range(n)]
        ref = memoryview(bytearray(arena))
        copies = fake.copies
        got = fake.run(jobs)
        assert got == plain.run(jobs) == _one_by_one(ref, jobs)
        assert bytes(arena) == bytes(plain_arena) == bytes(ref)
        assert fake.copies - copies == 1 + (2 if order == list(range(n)) else 1)  # up; back (in order: a run)
        out = base + n * length
        kept = [i for i, r in enumerate(got) if r[1]]  # all-zero blocks are holes: nothing to read back
        back = [(Op.DECOMPRESS, got[i][0], jobs[i][4], got[i][1], out + order[i] * length, length, got[i][2])
                for i in kept]  # fmt: skip
        ref = memoryview(bytearray(arena))
        got = fake.run(back)
        assert got == plain.run(back) == _one_by_one(ref, back) and [r[1] for r in got] == [length] * len(back)
        assert bytes(arena) == bytes(plain_arena) == bytes(ref)
        assert [bytes(arena[j[4] : j[4] + length]) for j in back] == [blocks[i] for i in kept]


def test_buffers_are_kept_grown_by_doubling_and_growth_drops_the_views() -> None:
    arena = np.zeros(1 << 10, dtype=np.uint8)
    stage = HostStage(arena, torch.from_numpy(arena))
    host = stage.buffer("up", 100, "cpu")
    assert stage.buffer("up", 1 << 16, "cpu") is host and host.numel() == 1 << 16 and not host.is_pinned()
    assert stage.views("k", lambda: [1]) is stage.views("k", lambda: [2])  # made once
    grown = stage.buffer("up", (1 << 16) + 1, "cpu")
    assert grown is not host and grown.numel() == 1 << 17 and stage.views("k", lambda: [2]) == [2]
    dev = stage.buffer("up-device", 8, "cpu", on_device=True)
    assert dev is not grown and dev.device.type == "cpu" and stage.buffer("up-device", 8, "cpu", on_device=True) is dev


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_path_matches_the_cpu_bit_for_bit() -> None:
    rng = np.random.default_rng(11)
    b, n = 4096, 40
    cpu_arena = memoryview(bytearray(3 * n * b))
    _fill(rng, cpu_arena, [i * b for i in range(n)], b)
    gpu_arena = memoryview(bytearray(cpu_arena))
    order = rng.permutation(n)  # destinations out of order (staged), then in order (straight into the arena)
    for dsts in ([(n + int(k)) * b for k in order], [(n + i) * b for i in range(n)]):
        jobs = [(Op.COMPRESS, Codec.ZVC, i * b, b, dsts[i], b, 0) for i in range(n)]
        want = ZvcBatcher(cpu_arena, "cpu", raw_reads=True).run(jobs)
        assert ZvcBatcher(gpu_arena, "cuda", raw_reads=True).run(jobs) == want
        back = [(Op.DECOMPRESS, c, dsts[i], s, (2 * n + i) * b, b, crc) for i, (c, s, crc) in enumerate(want) if s]
        cuda = ZvcBatcher(gpu_arena, "cuda", raw_reads=True)
        assert cuda.run(back) == ZvcBatcher(cpu_arena, "cpu", raw_reads=True).run(back)
        assert bytes(gpu_arena) == bytes(cpu_arena) and cuda.copies > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_after_the_first_upload_into_the_graphs_inputs_bit_for_bit() -> None:
    """Batch after batch through one CUDA batcher on a stream: from the second batch of a bucket the rows
    go straight into the graph's inputs and the rows and results come back in one copy."""
    rng = np.random.default_rng(14)
    b, n = 4096, 6
    cpu_arena = memoryview(bytearray(6 * n * b))
    gpu_arena = memoryview(bytearray(cpu_arena))
    cpu = ZvcBatcher(cpu_arena, "cpu", raw_reads=True)
    cuda = ZvcBatcher(gpu_arena, "cuda", raw_reads=True, graph_inputs=True)
    stream = torch.cuda.Stream()
    for k in range(4):
        blocks = _fill(rng, cpu_arena, [2 * i * b for i in range(n)], b)
        for i, blk in enumerate(blocks):
            gpu_arena[2 * i * b : (2 * i + 1) * b] = blk
        order = rng.permutation(n) if k % 2 else np.arange(n)
        jobs = [(Op.COMPRESS, Codec.ZVC, 2 * i * b, b, (2 * n + int(order[i])) * b, b, 0) for i in range(n)]
        want = cpu.run(jobs)
        assert cuda.run(jobs, stream=stream) == want
        back = [(Op.DECOMPRESS, c, j[4], s, (4 * n + i) * b, b, crc) for i, (j, (c, s, crc)) in enumerate(
            zip(jobs, want, strict=True)) if s]  # fmt: skip
        assert cuda.run(back, stream=stream) == cpu.run(back)
        assert bytes(gpu_arena) == bytes(cpu_arena)
    assert cuda.graphs.replays == 8 and cuda.graphs.inputs(("zvc-pack", b), n) is not None
