"""Gradient accumulation over micro-batches: on the device (planned) or on the host, always exact."""

from __future__ import annotations

import pytest
import torch
from offload_fixtures import tiny_llama, train_losses

import carina.offload as co
from carina.core.errors import CapacityError
from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import BlockPlan, BlockProfile, Hardware, ModelProfile, simulate

MiB = 1 << 20


def _plain(steps: int, accum: int):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = train_losses(model, opt, steps, accum=accum)
    return losses, model.state_dict()


def _offloaded(steps: int, accum: int, **cfg):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = co.wrap(model, co.Config(device="cpu", **cfg), optimizer=opt)
    losses = train_losses(model, opt, steps, accum=accum)
    return losses, model


def _block_numel(model) -> int:
    return sum(g.numel for g in co.handle_of(model).runtime.blocks)


def test_device_accumulation_is_bitwise_and_ships_each_block_once():
    ref, ref_state = _plain(4, accum=4)
    on, model_on = _offloaded(4, 4, grad_accumulation=4)
    off, model_off = _offloaded(4, 4, grad_accumulation=4, accumulate_on_device=False)
    assert on == off == ref
    for model in (model_on, model_off):
        state = model.state_dict()
        for name, value in ref_state.items():
            assert torch.equal(state[name], value), name
    plan_on, plan_off = co.handle_of(model_on).plan, co.handle_of(model_off).plan
    assert plan_on.counts()["grad_on_device"] == 4 and plan_off.counts()["grad_on_device"] == 0
    # 2 planned steps; per step each block sends 4 micro-batches of float32 gradients without
    # the accumulator, and its float32 sum once with it: 3 * 4 bytes per parameter less.
    moved_on = co.handle_of(model_on).stats().moved["device->host"]
    moved_off = co.handle_of(model_off).stats().moved["device->host"]
    assert moved_off - moved_on == 2 * 3 * 4 * _block_numel(model_on)


def test_device_accumulators_are_charged_and_the_budget_holds():
    budget = 1_300_000
    got, model = _offloaded(3, 4, grad_accumulation=4, device_budget=budget)
    ref, _ = _plain(3, accum=4)
    assert got == ref
    handle = co.handle_of(model)
    counts = handle.plan.counts()
    assert 1 <= counts["grad_on_device"] < 4 and counts["streamed"] > 0
    assert handle.stats().peak["device"] <= budget
    accs = [g for g in handle.runtime.blocks if g.acc is not None]
    assert len(accs) == counts["grad_on_device"]
    assert all(g.acc.dtype == torch.float32 and g.acc.numel() == g.numel for g in accs)


def test_a_step_before_the_configured_window_ends_flushes_the_device_sums():
    ref, ref_state = _plain(3, accum=2)
    got, model = _offloaded(3, 2, grad_accumulation=4)  # the loop steps every 2 micro-batches
    assert co.handle_of(model).plan.counts()["grad_on_device"] == 4
    assert got == ref
    state = model.state_dict()
    for name, value in ref_state.items():
        assert torch.equal(state[name], value), name


def test_more_micro_batches_than_configured_fall_back_to_host_adds():
    # the sum leaves the device after the configured 2nd micro-batch, the 3rd is added on the host
    # (updates wait for step(): an overlapped update would run before the 3rd micro-batch)
    ref, _ = _plain(3, accum=3)
    got, model = _offloaded(3, 3, grad_accumulation=2, overlap="step")
    assert co.handle_of(model).plan.counts()["grad_on_device"] == 4
    assert got == ref


def _prof(micro: int, n: int = 4) -> ModelProfile:
    blocks = tuple(BlockProfile(f"b{i}", 32 * MiB, 16 * MiB, 8 * MiB, 0.01) for i in range(n))
    return ModelProfile(blocks, 16 * MiB, 8 * MiB, 16 * MiB, 0.001, copy_bytes_per_param=2, micro_batches=micro)


HW = Hardware(h2d=20e9, d2h=20e9, optim=2e9, disk=1.5e9, grad_add=1e9, fold=3e9, cast=5e9)


def test_simulated_traffic_and_cpu_work_per_accumulation_mode():
    prof = _prof(4)
    host = tuple(BlockPlan() for _ in prof.blocks)
    dev = tuple(BlockPlan(grad_on_device=True) for _ in prof.blocks)
    ev_host, t_host = simulate(host, prof, HW, 1)
    ev_dev, t_dev = simulate(dev, prof, HW, 1)
    blocks = sum(b.numel for b in prof.blocks)
    # host: 4 micro-batches of bf16 gradients; device: one float32 sum per block
    grads_d2h_host = 4 * (blocks * 2 + prof.resident_param_bytes) / HW.d2h
    grads_d2h_dev = (blocks * 4 + 4 * prof.resident_param_bytes) / HW.d2h
    assert t_host.d2h == pytest.approx(grads_d2h_host)
    assert t_dev.d2h == pytest.approx(grads_d2h_dev)
    numel = prof.numel
    # the CPU worker: the first micro-batch folded (copied), three added, the update, the cast to the host copy
    assert t_host.cpu_fold == pytest.approx(numel / HW.fold + 3 * numel / HW.grad_add)
    assert t_host.cpu_optimizer == pytest.approx(numel / HW.optim + t_host.cpu_fold + numel / HW.cast)
    assert t_host.cpu_update == pytest.approx(numel / HW.optim)
    assert t_host.cpu_cast == pytest.approx(numel / HW.cast)
    rest = prof.resident_numel
    rest_fold = rest / HW.fold + 3 * rest / HW.grad_add  # the parameters outside blocks accumulate on the host
    assert t_dev.cpu_optimizer == pytest.approx(numel / HW.optim + rest_fold + numel / HW.cast)
    acc = 4 * blocks
    assert [e.device_bytes - acc for e in ev_dev] == [e.device_bytes for e in ev_host]
    assert len(ev_dev) == 4 * (2 * len(prof.blocks) + 1)
    assert t_dev.predicted < t_host.predicted


def test_planner_uses_leftover_memory_for_accumulators_only_with_micro_batches():
    budgets = PlanBudgets(device=1024 * MiB, host=None)
    assert make_plan(_prof(1), budgets, HW).counts()["grad_on_device"] == 0
    plan = make_plan(_prof(4), budgets, HW)
    assert plan.counts()["grad_on_device"] >= 1
    assert plan.device_peak <= budgets.device
    events, _ = simulate(plan.blocks, _prof(4), HW, 1)
    assert max(e.device_bytes for e in events) == plan.device_peak


def test_accumulators_never_make_an_impossible_budget_fit():
    floor = make_plan(_prof(4), PlanBudgets(device=None, host=None), HW, policy="recompute")
    with pytest.raises(CapacityError) as err:
        make_plan(_prof(4), PlanBudgets(device=100 * MiB, host=None), HW)
    assert err.value.context["tier"] == "device" and floor.device_peak > 100 * MiB


def test_forward_does_not_wait_for_gradient_adds_still_queued_on_the_cpu():
    import threading

    from offload_fixtures import token_batches

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = co.Config(device="cpu", device_budget=1_300_000, grad_accumulation=2, accumulate_on_device=False)
    model, opt = co.wrap(model, cfg, optimizer=opt)
    train_losses(model, opt, 2, accum=2)  # the profiling steps
    rt = co.handle_of(model).runtime
    gate = threading.Event()
    rt.worker.submit(gate.wait)  # the CPU worker is busy: every add queued from now on waits
    ids = token_batches(1)[0]
    (model(input_ids=ids, labels=ids).loss / 2).backward()  # micro-batch 1: its adds are queued
    assert any(g.pending for g in rt.blocks) and not any(g.updates for g in rt.blocks)
    done = threading.Event()

    def forward() -> None:
        with torch.no_grad():  # fetches every block's weights
            model(input_ids=ids)
        done.set()

    threading.Thread(target=forward, daemon=True).start()
    finished = done.wait(timeout=120)  # a liveness check: waiting for the gated adds would never finish
    gate.set()
    assert finished
    opt.step()
    opt.zero_grad()
