"""Which blocks keep their activations: most recompute time per byte-second of device memory."""

from __future__ import annotations

import pytest

from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import Action, BlockPlan, BlockProfile, Hardware, ModelProfile, simulate

MiB = 1 << 20


def _alike(n: int = 4, fwd: float = 0.01, head: float = 0.002) -> ModelProfile:
    blocks = tuple(BlockProfile(f"b{i}", 8 * MiB, 4 * MiB, 64 * MiB, fwd) for i in range(n))
    return ModelProfile(blocks, 4 * MiB, 2 * MiB, 0, head, copy_bytes_per_param=2, fold_on_device=True,
                        rest_cast_on_device=True)  # fmt: skip


def test_lifetimes_are_the_passes_between_a_blocks_forward_and_its_backward():
    prof = _alike(fwd=0.01, head=0.002)
    # the head's forward and backward, and every block above the block's forward and backward
    assert prof.kept_lifetimes() == pytest.approx([3 * (0.002 + k * 0.01) for k in (3, 2, 1, 0)])


def test_alike_blocks_keep_from_the_last_down():
    prof = _alike()
    hw = Hardware(h2d=10e9, d2h=10e9, optim=1e12, disk=1e9)
    every = tuple(BlockPlan(cast_on_device=True) for _ in prof.blocks)
    floor = max(e.device_bytes for e in simulate(every, prof, hw, 1)[0])
    budget = floor + prof.blocks[0].act_bytes + MiB  # room for some blocks' kept activations, not all
    plan = make_plan(prof, PlanBudgets(device=budget, host=None), hw, policy="plan", cast="device")
    kept = [i for i, b in enumerate(plan.blocks) if b.activation is Action.KEEP]
    assert 0 < len(kept) < len(prof.blocks)
    assert kept == list(range(len(prof.blocks) - len(kept), len(prof.blocks)))  # the last ones, not the first
    assert plan.device_peak <= budget
