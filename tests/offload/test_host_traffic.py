"""The host memory term of the step model: the bytes it counts and how the planner weighs them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.profiler import host_memory_rate
from carina.offload.simulator import Action, BlockPlan, BlockProfile, Hardware, ModelProfile, simulate

MiB = 1 << 20
N = 16 * MiB  # parameters of the one block


def _one_block() -> ModelProfile:
    block = BlockProfile("b0", 2 * N, N, 0, 1e-3)
    return ModelProfile((block,), 0, 0, 0, 0.0, copy_bytes_per_param=2, fold_on_device=True,
                        rest_cast_on_device=True)  # fmt: skip


def test_traffic_counts_every_pinned_copy_and_the_update_pass():
    prof, plan = _one_block(), (BlockPlan(cast_on_device=True),)
    _, t = simulate(plan, prof, Hardware(h2d=10e9, d2h=10e9, optim=1e9, disk=1e9), 1)
    # float32 master in (4), float32 gradient out (4), AdamW reads master, gradient, m, v and writes master, m, v (28)
    assert t.host_traffic == (4 + 4 + 28) * N
    assert t.host_memory == 0.0 and t.host_bandwidth == 0.0  # not modeled: no bandwidth given
    # cast on the host instead: a bf16 copy crosses (2), the CPU reads the master and writes the copy (4 + 2)
    _, t = simulate((BlockPlan(),), prof, Hardware(h2d=10e9, d2h=10e9, optim=1e9, disk=1e9), 1)
    assert t.host_traffic == (2 + 4 + 28 + 6) * N


def test_host_bandwidth_stretches_the_worker_and_names_the_bottleneck():
    prof, plan = _one_block(), (BlockPlan(cast_on_device=True),)
    hw = Hardware(h2d=100e9, d2h=100e9, optim=1e9, disk=1e9)
    _, free = simulate(plan, prof, hw, 1)
    bw = 36 * N / (2 * N / hw.optim)  # the step's traffic takes twice the update alone
    _, tight = simulate(plan, prof, replace(hw, host_mem=bw), 1)
    assert tight.host_memory == pytest.approx(2 * N / hw.optim)
    assert tight.cpu_update == pytest.approx(2 * free.cpu_update)
    assert tight.bottleneck == "host_memory" and free.bottleneck == "cpu_optimizer"
    assert tight.predicted >= tight.host_memory and tight.predicted > free.predicted
    _, loose = simulate(plan, prof, replace(hw, host_mem=100 * bw), 1)
    assert loose.predicted == free.predicted and loose.cpu_update == free.cpu_update


def test_host_memory_rate_takes_the_larger_lower_bound():
    assert host_memory_rate(4e9, 8) == 4e9 * 28
    assert host_memory_rate(4e9, 8, measured=200e9) == 200e9


def _streamed(n: int = 4) -> ModelProfile:
    blocks = tuple(BlockProfile(f"b{i}", 2 * N, N, 4 * MiB, 2e-3) for i in range(n))
    return ModelProfile(blocks, 0, 0, 0, 0.0, copy_bytes_per_param=2, fold_on_device=True, rest_cast_on_device=True)


def test_planner_casts_where_the_scarcer_resource_says():
    """A slow link and ample host memory: host copies (half the bytes cross); the reverse: cast on the device."""
    prof, budgets = _streamed(), PlanBudgets(device=None, host=None)
    slow_link = Hardware(h2d=1e9, d2h=50e9, optim=50e9, disk=1e9, cast=50e9, host_mem=1e13)
    plan = make_plan(prof, budgets, slow_link, cast="auto", policy="recompute")
    assert plan.counts()["cast_on_device"] == 0
    slow_memory = Hardware(h2d=50e9, d2h=50e9, optim=50e9, disk=1e9, cast=50e9, host_mem=2e9)
    plan = make_plan(prof, budgets, slow_memory, cast="auto", policy="recompute")
    assert plan.counts()["cast_on_device"] == len(prof.blocks)
    assert all(b.activation is Action.RECOMPUTE for b in plan.blocks)
    assert plan.summary()["host_memory"] == {"traffic_bytes_per_step": plan.time.host_traffic,
                                             "bandwidth_bytes_per_s": 2e9}  # fmt: skip
