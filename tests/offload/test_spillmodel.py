"""The spill pipeline on the simulator's timeline: exact numbers on small cases, bounds on random ones."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.offload.simulator import Action, BlockPlan, BlockProfile, Hardware, ModelProfile, simulate
from carina.offload.spillmodel import SpillDisk

MiB = 1 << 20


def test_a_spilled_update_reads_ahead_and_writes_beside_the_update():
    serial = SpillDisk(pipelined=False)
    assert serial.run(worker=1.0, ready=2.0, cpu=0.5, disk=4.0) == 6.5  # read, update, write in series
    assert serial.settled == 0.0
    disk = SpillDisk()
    assert disk.run(worker=3.0, ready=4.0, cpu=1.0) == 5.0  # nothing spilled: the worker alone
    # read 0-2 (ahead of the gradients at 1.5), update 2-2.5, writes 2-4
    assert disk.run(worker=1.0, ready=1.5, cpu=0.5, disk=4.0) == 2.5
    assert disk.free == 4.0
    # the next read waits for those writes (one slot): 4-6, update 6-6.5, writes 6-8
    assert disk.run(worker=2.5, ready=0.0, cpu=0.5, disk=4.0) == 6.5
    assert disk.settled == 8.0
    # an update longer than its writes holds the slot until it ends
    assert disk.run(worker=0.0, ready=0.0, cpu=3.0, disk=2.0) == 12.0 and disk.free == 12.0


def _disk_bound(pipeline: bool, carry: bool = False) -> tuple[float, float]:
    """4 blocks of 8M parameters, the last 2 spilled; updates 0.1 s each, 1 s of disk per spilled block."""
    n, numel = 4, 8 * MiB
    blocks = tuple(BlockProfile(f"b{i}", 2 * numel, numel, MiB, 1e-5) for i in range(n))
    prof = ModelProfile(blocks, 2 * numel, numel, MiB, 1e-5, fold_on_device=True, spill_pipeline=pipeline)
    hw = Hardware(h2d=1e15, d2h=1e15, optim=numel / 0.1, disk=2 * 8 * numel / 1.0)
    plan = tuple(BlockPlan(resident=True, activation=Action.KEEP, state_on_nvme=i >= 2) for i in range(n))
    _, t = simulate(plan, prof, hw, 1, overlap=True, carry=carry)
    return t.predicted, t.disk


@pytest.mark.parametrize("carry", [False, True])
def test_the_disk_bound_step_hides_every_update_with_the_pipeline(carry):
    step, disk = _disk_bound(pipeline=True, carry=carry)
    assert disk == pytest.approx(2.0)
    assert step == pytest.approx(2.0, abs=1e-3)  # the disk's 2 s: 5 updates of 0.1 s ran beside it
    serial, _ = _disk_bound(pipeline=False, carry=carry)
    # in series: the 2 spilled blocks' reads, updates and writes, and the 3 other updates after them
    assert serial == pytest.approx(2.0 + 5 * 0.1, abs=1e-3)


@st.composite
def spilled_problems(draw):
    n = draw(st.integers(1, 8))
    blocks = tuple(
        BlockProfile(f"b{i}", draw(st.integers(1, 64)) * MiB, draw(st.integers(1, 32)) * MiB,
                     draw(st.integers(0, 64)) * MiB, draw(st.floats(1e-4, 0.2)))
        for i in range(n)
    )  # fmt: skip
    prof = ModelProfile(blocks, draw(st.integers(0, 64)) * MiB, draw(st.integers(0, 16)) * MiB, MiB,
                        draw(st.floats(0, 0.05)), micro_batches=draw(st.integers(1, 3)),
                        fold_on_device=draw(st.booleans()))  # fmt: skip
    host_mem = draw(st.one_of(st.just(0.0), st.floats(5e9, 3e11)))
    hw = Hardware(h2d=draw(st.floats(1e9, 60e9)), d2h=draw(st.floats(1e9, 60e9)), optim=draw(st.floats(1e8, 6e9)),
                  disk=draw(st.floats(1e8, 3e9)), host_mem=host_mem)  # fmt: skip
    plan = tuple(
        BlockPlan(resident=draw(st.booleans()), activation=draw(st.sampled_from(list(Action))),
                  state_on_nvme=draw(st.booleans()))
        for _ in range(n)
    )  # fmt: skip
    return prof, hw, plan, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(spilled_problems())
def test_the_pipeline_never_predicts_a_slower_step_nor_one_faster_than_the_disk(problem):
    prof, hw, plan, overlap, carry = problem
    _, on = simulate(plan, prof, hw, 1, overlap=overlap, carry=carry)
    _, off = simulate(plan, replace(prof, spill_pipeline=False), hw, 1, overlap=overlap, carry=carry)
    assert on.disk == pytest.approx(off.disk)
    assert on.predicted <= off.predicted * (1 + 1e-9)
    assert on.predicted >= on.disk * (1 - 1e-9)  # the disk moves one block at a time, in series
