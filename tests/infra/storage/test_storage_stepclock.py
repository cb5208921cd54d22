"""The GPU engines' step times: what the next H200 run reads to see where a batch's host time goes.

Real engines on the CPU (the torch engine's ZVC path, the nvcomp engine with the named CPU stand-in); the
tests check which steps are timed, how often, that the warm-up is left out and that the figures survive
``close()`` (a front end reports after it), never how long anything took.
"""

from __future__ import annotations

import asyncio

import pytest

from carina.infra.storage.codecs import Codec, Op
from carina.infra.storage.nvcomp_engine import NvcompEngine
from carina.infra.storage.qemuload import step_times
from carina.infra.storage.stepclock import StepClock
from carina.infra.storage.torch_engine import TorchEngine
from carina.testing.batchcodec import CpuStandInBatchCodec

B = 4 << 10


def test_step_clock_counts_each_step_and_forgets_on_reset() -> None:
    clock = StepClock()
    for _ in range(3):
        with clock.step("upload"):
            sum(range(1000))
    with pytest.raises(ValueError), clock.step("codec"):  # a step that raises is still timed
        raise ValueError("codec rejected the batch")
    got = clock.report()
    assert got["engine_step_upload_n"] == 3 and got["engine_step_codec_n"] == 1
    assert all(v >= 0 for v in got.values()) and set(got) == {
        f"engine_step_{s}_{k}" for s in ("upload", "codec") for k in ("wall_s", "cpu_s", "n")
    }
    clock.reset()
    assert clock.report() == {}


def test_laps_time_consecutive_steps_and_are_added_once() -> None:
    clock = StepClock()
    for k in range(2):
        laps = clock.laps()
        sum(range(1000))
        laps.lap("plan")
        for _ in range(3):
            laps.lap("upload")
        assert clock.report().get("engine_step_plan_n", 0) == k  # nothing added before close
        laps.close()
        laps.close()  # a second close adds nothing
    got = clock.report()
    assert got["engine_step_plan_n"] == 2 and got["engine_step_upload_n"] == 6
    assert set(got) == {f"engine_step_{s}_{k}" for s in ("plan", "upload") for k in ("wall_s", "cpu_s", "n")}
    assert all(v >= 0 for v in got.values())


def _round_trip(engine, codec: Codec, n: int) -> None:
    """``n`` one-block requests compressed as one batch, then decompressed as another; bit-exact."""
    sparse = bytearray(B)  # ZVC shrinks sparse blocks (text it stores raw, and raw reads stay on the CPU here)
    sparse[::7] = bytes(i % 251 + 1 for i in range(len(sparse[::7])))
    text = bytes(sparse)
    for i in range(n):
        engine.arena.view[(32 + i) * B : (33 + i) * B] = text
    jobs = [(Op.COMPRESS, codec, (32 + i) * B, B, (48 + i) * B, B, 0) for i in range(n)]

    async def go(js):
        return [r[0] for r in await asyncio.gather(*(engine.run([j]) for j in js))]

    stored = asyncio.run(go(jobs))
    back = [(Op.DECOMPRESS, used, (48 + i) * B, clen, (64 + i) * B, B, crc)
            for i, (used, clen, crc) in enumerate(stored)]  # fmt: skip
    asyncio.run(go(back))
    assert all(bytes(engine.arena.view[(64 + i) * B : (65 + i) * B]) == text for i in range(n))


def test_torch_engine_reports_its_batches_steps_without_the_warm_up() -> None:
    engine = TorchEngine(96 * B, device="cpu", workers=1)
    try:
        engine.prepare(B, Codec.ZVC)
        assert not any(k.startswith("engine_step_") for k in engine.report())
        _round_trip(engine, Codec.ZVC, 4)
    finally:
        engine.close()
    got = engine.report()  # after close, as a front end reports
    assert engine.batches == 2
    for step in ("plan", "upload", "device", "download", "scatter"):
        assert got[f"engine_step_{step}_n"] >= 2 and got[f"engine_step_{step}_wall_s"] >= 0, step
    assert got["engine_step_device_n"] == 2  # one device step per batch: four requests each went as one group
    assert "engine_step_codec_n" not in got  # ZVC has no separate codec call


def test_nvcomp_engine_times_its_codec_calls_apart() -> None:
    stand_in = CpuStandInBatchCodec()
    engine = NvcompEngine(96 * B, device="cpu", workers=1, batch_codec=stand_in)
    try:
        engine.prepare(B, Codec.DEFLATE)
        calls = stand_in.calls  # the warm-up's round trip
        assert calls == 2 and not any(k.startswith("engine_step_") for k in engine.report())
        _round_trip(engine, Codec.DEFLATE, 3)
        got = engine.report()
    finally:
        engine.close()
    assert got["engine_step_codec_n"] == stand_in.calls - calls == 2  # one nvCOMP call per batch
    assert got["engine_step_upload_n"] == got["engine_step_download_n"] == 2


def test_step_times_are_per_batch_over_all_front_ends() -> None:
    ends = [
        {"engine_batches": 3, "engine_step_codec_wall_s": 0.003, "engine_step_codec_cpu_s": 0.001},
        {"engine_batches": 1, "engine_step_codec_wall_s": 0.001, "engine_step_codec_cpu_s": 0.003},
    ]
    got = step_times(ends, 4)
    assert got == pytest.approx({"step_codec_wall_us": 1000.0, "step_codec_cpu_us": 1000.0})
    assert step_times([{"engine_batches": 5}], 5) == {}  # engines that time no steps add no columns
