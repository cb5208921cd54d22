"""Updates that finish after ``optimizer.step()`` returns: next-use order, LR schedulers, exact results."""

from __future__ import annotations

import threading

import pytest
import torch
from offload_fixtures import tiny_llama, token_batches, train_losses

import carina.offload as co


def _plain_scheduled(steps: int):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    return train_losses(model, opt, steps, scheduler=sched), model.state_dict()


def test_updates_run_past_step_in_next_use_order_and_stay_exact():
    steps = 4
    ref, ref_state = _plain_scheduled(steps)
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model, opt = co.wrap(model, co.Config(device="cpu", device_budget=1_300_000, step_barrier=False), optimizer=opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    rt = co.handle_of(model).runtime
    order: list[int] = []
    inner = rt.step_group

    def recording(g, options):
        order.append(g.index)
        inner(g, options)

    rt.step_group = recording
    batches = token_batches(steps)
    losses = []
    for k, ids in enumerate(batches):
        gate = threading.Event()
        held = k >= opt.cfg.profile_steps  # planned steps: hold the worker so every update queues up
        if held:
            rt.worker.submit(gate.wait, priority=-10)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        del order[:]
        opt.step()
        if held:  # step() returned with the blocks' updates still queued: the scheduler steps meanwhile
            assert all(g.detached for g in rt.blocks)
        opt.zero_grad()
        sched.step()
        gate.set()
        opt.synchronize()
        if held:  # the worker took them in the order the next forward needs them
            assert order == [len(rt.blocks), *range(len(rt.blocks))]
    assert losses == ref
    state = model.state_dict()
    for name, value in ref_state.items():
        assert torch.equal(state[name], value), name


def test_step_barrier_waits_for_every_update():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    cfg = co.Config(device="cpu", device_budget=1_300_000, step_barrier=True)
    model, opt = co.wrap(model, cfg, optimizer=opt)
    rt = co.handle_of(model).runtime
    for ids in token_batches(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        assert not any(g.pending or g.detached for g in rt.groups)


def test_simulated_carry_over_overlaps_the_next_forward():
    from carina.offload.simulator import BlockPlan, BlockProfile, Hardware, ModelProfile, simulate

    mib = 1 << 20
    blocks = tuple(BlockProfile(f"b{i}", 32 * mib, 16 * mib, 8 * mib, 0.01) for i in range(6))
    prof = ModelProfile(blocks, 16 * mib, 8 * mib, 16 * mib, 0.002, fold_on_device=True)
    hw = Hardware(h2d=20e9, d2h=20e9, optim=1e9, disk=1.5e9)  # the CPU worker is the bottleneck
    plan = tuple(BlockPlan() for _ in blocks)
    _, barrier = simulate(plan, prof, hw, 1, True, carry=False)
    _, carry = simulate(plan, prof, hw, 1, True, carry=True)
    assert carry.cpu_optimizer == pytest.approx(barrier.cpu_optimizer)
    assert carry.predicted < barrier.predicted  # the forward runs beside the last updates
    assert carry.predicted >= carry.cpu_optimizer - 1e-9  # the worker's own time still bounds the step
    _, no_overlap = simulate(plan, prof, hw, 1, False, carry=True)  # updates at step(): nothing to carry
    assert no_overlap.predicted == pytest.approx(simulate(plan, prof, hw, 1, False)[1].predicted)
