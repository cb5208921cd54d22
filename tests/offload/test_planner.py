"""The planner, property-tested in its own simulation (pure Python, no torch work)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import CapacityError
from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import Action, BlockProfile, Hardware, ModelProfile, host_bytes, simulate

MiB = 1 << 20


@st.composite
def problems(draw):
    n = draw(st.integers(1, 12))
    blocks = tuple(
        BlockProfile(
            f"b{i}",
            draw(st.integers(1, 64)) * MiB,
            draw(st.integers(1, 32)) * MiB // 2,
            draw(st.integers(0, 128)) * MiB,
            draw(st.floats(1e-4, 0.5)),
        )
        for i in range(n)
    )
    prof = ModelProfile(
        blocks,
        resident_param_bytes=draw(st.integers(0, 64)) * MiB,
        resident_numel=draw(st.integers(0, 16)) * MiB,
        other_act_bytes=draw(st.integers(0, 64)) * MiB,
        other_fwd_s=draw(st.floats(0, 0.1)),
        copy_bytes_per_param=draw(st.sampled_from([0, 2])),
        staging_bytes_per_param=draw(st.sampled_from([0, 2, 4])),
        fold_on_device=draw(st.booleans()),
        rest_cast_on_device=draw(st.booleans()),
        micro_batches=draw(st.integers(1, 4)),
    )
    hw = Hardware(
        h2d=draw(st.floats(1e9, 60e9)),
        d2h=draw(st.floats(1e9, 60e9)),
        optim=draw(st.floats(1e8, 6e9)),
        disk=draw(st.floats(1e8, 3e9)),
        grad_add=draw(st.floats(5e8, 8e9)),
        fold=draw(st.floats(1e9, 2e10)),
        cast=draw(st.floats(1e9, 2e10)),
        host_mem=draw(st.one_of(st.just(0.0), st.floats(5e9, 3e11))),
    )
    budgets = PlanBudgets(
        device=draw(st.integers(16, 4096)) * MiB,
        host=draw(st.one_of(st.none(), st.integers(64, 8192).map(lambda m: m * MiB))),
        nvme=draw(st.integers(0, 4096)) * MiB,
    )
    policy = draw(st.sampled_from(["plan", "keep", "swap", "recompute"]))
    depth = draw(st.integers(1, 3))
    overlap = draw(st.booleans())
    options = {"cast": draw(st.sampled_from(["host", "device", "auto"])), "carry": draw(st.booleans())}
    return prof, hw, budgets, policy, depth, overlap, options


@settings(max_examples=300, deadline=None)
@given(problems())
def test_plan_fits_budgets_and_never_computes_before_prefetch(problem):
    prof, hw, budgets, policy, depth, overlap, options = problem
    try:
        plan = make_plan(prof, budgets, hw, policy=policy, prefetch_depth=depth, overlap=overlap, **options)
    except CapacityError as exc:
        assert exc.context["tier"] in ("device", "host", "nvme")
        assert exc.context["needed"] > exc.context["budget"]
        return
    events, time = simulate(plan.blocks, prof, hw, depth, overlap, options["carry"], plan.act_lead)
    assert max(e.device_bytes for e in events) <= budgets.device
    host, nvme = host_bytes(prof, plan.blocks)
    assert budgets.host is None or host <= budgets.host
    assert nvme <= budgets.nvme
    for e in events:
        if e.kind != "head":
            assert 0 <= e.ready <= e.start  # parameters arrived before the block computed
    starts = [e.start for e in events]
    assert starts == sorted(starts)
    assert time.predicted >= time.compute - 1e-9
    if policy != "plan":
        assert all(b.activation is Action(policy) for b in plan.blocks)
    assert [e.kind for e in events].count("bwd") == len(prof.blocks) * prof.micro_batches
    if prof.micro_batches == 1:
        assert plan.counts()["grad_on_device"] == 0


def _simple(n=8, act=64 * MiB):
    blocks = tuple(BlockProfile(f"b{i}", 32 * MiB, 16 * MiB, act, 0.01) for i in range(n))
    return ModelProfile(blocks, 16 * MiB, 8 * MiB, 16 * MiB, 0.001, copy_bytes_per_param=2)


def test_more_device_memory_never_predicts_a_slower_step():
    prof, hw = _simple(), Hardware(20e9, 20e9, 2e9, 1.5e9)
    times = [make_plan(prof, PlanBudgets(device=d * MiB, host=None), hw).time.predicted for d in (400, 600, 900, 2000)]
    assert times == sorted(times, reverse=True)


def test_unlimited_device_keeps_everything_resident():
    plan = make_plan(_simple(), PlanBudgets(device=None, host=None), Hardware(20e9, 20e9, 2e9, 1.5e9))
    assert plan.counts()["resident"] == 8 and plan.counts()["keep"] == 8
    # no streaming: the link carries only the updated weights, once per step
    prof = _simple()
    once = sum(b.param_bytes for b in prof.blocks) + prof.resident_param_bytes
    assert plan.time.h2d == pytest.approx(once / 20e9)


def test_host_shortfall_spills_state_to_nvme_or_says_what_fits():
    prof, hw = _simple(), Hardware(20e9, 20e9, 2e9, 1.5e9)
    full, _ = host_bytes(prof, tuple(make_plan(prof, PlanBudgets(device=None, host=None), hw).blocks))
    plan = make_plan(prof, PlanBudgets(device=None, host=full - 200 * MiB, nvme=1 << 40), hw)
    assert plan.counts()["state_on_nvme"] >= 2 and plan.time.disk > 0
    with pytest.raises(CapacityError) as err:
        make_plan(prof, PlanBudgets(device=None, host=full - 200 * MiB, nvme=0), hw)
    assert "nvme_budget" in str(err.value)


def test_configs_roundtrip_through_toml_and_reject_unknown_keys():
    from carina.core.errors import ConfigError
    from carina.offload.config import OffloadConfig
    from carina.offload.job import DEMO, TrainConfig

    cfg = OffloadConfig(device="cpu", device_budget=1 << 20, activations="swap", max_grad_norm=1.0)
    assert OffloadConfig.from_toml(cfg.to_toml()) == cfg
    assert TrainConfig.from_json(DEMO.to_json()) == DEMO
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({"offload": {"budget": 3}})
    assert err.value.context["key"] == "offload.budget"
