"""Swapped activations in the step model: drains that outlast a block, and fetching them back ahead."""

from __future__ import annotations

from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import Action, BlockPlan, BlockProfile, Hardware, ModelProfile, simulate

MiB = 1 << 20
ACT = 64 * MiB


def _prof(n: int = 6, fwd: float = 1e-3) -> ModelProfile:
    blocks = tuple(BlockProfile(f"b{i}", 2 * MiB, MiB, ACT, fwd) for i in range(n))
    return ModelProfile(blocks, 0, 0, 0, 0.0)


def test_a_swap_still_draining_stays_on_the_device():
    """A slow link: block 0's activations are still on their way to the host when block 2 runs."""
    prof = _prof(3)
    plan = tuple(BlockPlan(resident=True, activation=Action.SWAP) for _ in prof.blocks)
    slow = Hardware(h2d=1e12, d2h=ACT / 0.1, optim=1e12, disk=1e9)  # 0.1 s per swap, 1 ms per block
    events, _ = simulate(plan, prof, slow, 1)
    fwd = [e for e in events if e.kind == "fwd"]
    params = 3 * 2 * MiB
    assert fwd[2].device_bytes == params + 3 * ACT  # its own, block 1's and block 0's (both still draining)
    fast = Hardware(h2d=1e12, d2h=1e14, optim=1e12, disk=1e9)
    events, _ = simulate(plan, prof, fast, 1)
    assert [e for e in events if e.kind == "fwd"][2].device_bytes == params + 2 * ACT  # block 0's arrived


def test_fetching_ahead_hides_the_link_and_costs_device_bytes():
    """Blocks 1 and 4 swap (the rest keep): block 1's 40 ms copy hides behind three blocks' backward, not one."""
    prof = _prof(6, fwd=0.01)
    plan = tuple(BlockPlan(resident=True, activation=Action.SWAP if i in (1, 4) else Action.KEEP) for i in range(6))
    hw = Hardware(h2d=ACT / 0.04, d2h=1e14, optim=1e12, disk=1e9)  # 40 ms per block back, 20 ms of backward
    ev1, t1 = simulate(plan, prof, hw, 1, act_lead=1)
    ev3, t3 = simulate(plan, prof, hw, 1, act_lead=3)
    assert t3.predicted < t1.predicted
    bwd1 = {e.block: e.device_bytes for e in ev1 if e.kind == "bwd"}
    bwd3 = {e.block: e.device_bytes for e in ev3 if e.kind == "bwd"}
    assert bwd3[4] - bwd1[4] == ACT  # block 1's activations are back already (3 and 2 are kept anyway)
    assert bwd3[0] == bwd1[0]  # nothing left below the first block


def test_planner_fetches_ahead_only_where_it_pays_and_fits():
    fwd = [0.01, 0.01, 0.05, 0.01, 0.01, 0.05]
    blocks = tuple(BlockProfile(f"b{i}", 2 * MiB, MiB, ACT, f) for i, f in enumerate(fwd))
    prof = ModelProfile(blocks, 0, 0, 0, 0.0)
    hw = Hardware(h2d=ACT / 0.04, d2h=ACT / 0.005, optim=1e12, disk=1e9)
    roomy = make_plan(prof, PlanBudgets(device=None, host=None), hw, policy="swap")
    assert roomy.act_lead == 2  # the fastest of leads 1..3 here
    events, time = simulate(roomy.blocks, prof, hw, 1, True, False, roomy.act_lead)
    assert time.predicted == roomy.time.predicted and max(e.device_bytes for e in events) == roomy.device_peak
    lead1 = make_plan(prof, PlanBudgets(device=None, host=None), hw, policy="swap", act_lead=1)
    assert lead1.time.predicted > roomy.time.predicted and lead1.device_peak < roomy.device_peak
    tight = make_plan(prof, PlanBudgets(device=lead1.device_peak, host=None), hw, policy="swap")
    assert tight.act_lead == 1  # the deeper lead does not fit
