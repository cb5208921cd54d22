"""Gradients that leave the device in the compute dtype when nothing needs their float32 sum."""

from __future__ import annotations

import pytest
import torch
from offload_fixtures import tiny_llama, token_batches, train_losses

import carina.offload as co
import carina.offload.flatstep as flatstep
from carina.offload.simulator import Action, BlockPlan, BlockProfile, Hardware, ModelProfile, simulate

STEPS = 6
MiB = 1 << 20


def _run(narrow: bool, steps: int = STEPS, device: str = "cpu", **cfg_kwargs):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    cfg = co.Config(device=device, compute_dtype="bfloat16", device_budget=1_300_000, activations="recompute",
                    **cfg_kwargs)  # fmt: skip
    model, opt = co.wrap(model, cfg, optimizer=opt)
    opt.narrow_grads = narrow
    losses = train_losses(model, opt, steps, clip=cfg.max_grad_norm, device=device)
    masters = {k: v.clone() for k, v in model.state_dict().items()}
    state = opt.state_dict()["state"]
    handle = co.handle_of(model)
    numel = sum(g.numel for g in handle.runtime.groups)
    return losses, masters, state, handle.stats().moved["device->host"], numel


def _same(a, b):
    assert a[0] == b[0]
    for name in a[1]:
        assert torch.equal(a[1][name], b[1][name]), name
    for k, s in a[2].items():
        for key, t in s.items():
            assert torch.equal(t, b[2][k][key]), (k, key)


@pytest.mark.parametrize("overlap", ["auto", "step"])
def test_compute_dtype_gradients_give_the_float32_paths_bits(monkeypatch, overlap):
    monkeypatch.setattr(flatstep, "UPCAST_CHUNK", 1000)  # several chunks per group, the last one ragged
    wide = _run(False, overlap=overlap)
    narrow = _run(True, overlap=overlap)
    _same(wide, narrow)
    # every group narrow from the second step on (the first update makes the flat state): 2 bytes fewer each
    assert narrow[3] == wide[3] - (STEPS - 1) * 2 * wide[4]


def test_clipping_keeps_float32_gradients():
    clipped, wide = _run(True, steps=3, max_grad_norm=0.5), _run(False, steps=3, max_grad_norm=0.5)
    _same(wide, clipped)
    assert clipped[3] == wide[3]  # the same bytes leave the device: float32 gradients


def test_float32_compute_is_untouched():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model, opt = co.wrap(model, co.Config(device="cpu", device_budget=1_300_000), optimizer=opt)
    assert not opt.narrows()


# -- the step model ------------------------------------------------------------------------------
N = 16 * MiB


def _prof(**kw) -> ModelProfile:
    block = BlockProfile("b0", 2 * N, N, 0, 1e-3)
    kw = {"fold_on_device": True, **kw}
    return ModelProfile((block,), 0, 0, 0, 0.0, copy_bytes_per_param=2, rest_cast_on_device=True, **kw)


HW = Hardware(h2d=10e9, d2h=10e9, optim=1e9, disk=1e9)


def test_narrow_gradients_halve_the_download_but_pay_the_upcast_pass():
    plan = (BlockPlan(cast_on_device=True, activation=Action.RECOMPUTE),)
    _, wide = simulate(plan, _prof(), HW, 1)
    _, narrow = simulate(plan, _prof(narrow_grads=True), HW, 1)
    # float32 master in (4), float32 gradient out (4), AdamW's 28; narrow: 2 out, the update reads 2 of
    # gradient, and the upcast writes its float32 chunk (4) that the update reads back (4)
    assert wide.host_traffic == (4 + 4 + 28) * N
    assert narrow.host_traffic == (4 + 2 + 26 + 8) * N
    assert narrow.d2h == pytest.approx(2 * N / HW.d2h) and wide.d2h == pytest.approx(4 * N / HW.d2h)
    # the update's time: AdamW, plus the upcast as a fold pass of its own
    assert narrow.cpu_update == pytest.approx(N / HW.optim + N / HW.fold) and wide.cpu_update == pytest.approx(
        N / HW.optim
    )


@pytest.mark.parametrize(
    ("kw", "block"),
    [
        ({"micro_batches": 2}, BlockPlan()),
        ({}, BlockPlan(state_on_nvme=True)),
        ({"fold_on_device": False}, BlockPlan()),
    ],
)
def test_narrow_gradients_only_where_nothing_needs_their_float32_sum(kw, block):
    _, wide = simulate((block,), _prof(**kw), HW, 1)
    _, narrow = simulate((block,), _prof(narrow_grads=True, **kw), HW, 1)
    assert narrow.host_traffic == wide.host_traffic and narrow.d2h == wide.d2h


def test_narrow_gradients_take_less_device_memory_in_backward():
    plan = (BlockPlan(),)
    wide, _ = simulate(plan, _prof(), HW, 1)
    narrow, _ = simulate(plan, _prof(narrow_grads=True), HW, 1)
    bwd = [e.device_bytes for e in wide if e.kind == "bwd"], [e.device_bytes for e in narrow if e.kind == "bwd"]
    assert bwd[0][0] - bwd[1][0] == 2 * N  # its float32 copy draining, now bf16 (no group above it here)


def _two_backwards(narrow: bool):
    """Two backward passes before each step with grad_accumulation 1: the second adds on the host."""
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    cfg = co.Config(device="cpu", compute_dtype="bfloat16", device_budget=1_300_000, overlap="step")
    model, opt = co.wrap(model, cfg, optimizer=opt)
    opt.narrow_grads = narrow
    for k, ids in enumerate(token_batches(8)):
        model(input_ids=ids, labels=ids).loss.backward()
        if k % 2:
            opt.step()
            opt.zero_grad()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_gradient_added_to_a_narrow_one_widens_it_first(monkeypatch):
    monkeypatch.setattr(flatstep, "UPCAST_CHUNK", 1000)
    wide, narrow = _two_backwards(False), _two_backwards(True)
    for name in wide:
        assert torch.equal(wide[name], narrow[name]), name


def test_widen_grad_restores_the_float32_gradient_in_place():
    from carina.offload.blocks import ParamGroup

    n = 2500
    grad = torch.randn(n)
    g = ParamGroup(0, "g", None, [], [], torch.zeros(n), grad.clone(), None, None, torch.empty(n, dtype=torch.bfloat16))
    g.narrow_grad.copy_(grad.bfloat16())
    g.narrow = True
    g.widen_grad(1000)  # chunks of 1000, the last one 500
    assert torch.equal(g.grad, grad.bfloat16().float()) and not g.narrow


def test_compute_dtype_gradients_are_opt_in():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    cfg = co.Config(device="cpu", compute_dtype="bfloat16", device_budget=1_300_000)
    model, opt = co.wrap(model, cfg, optimizer=opt)
    assert not opt.narrows()  # the default since session 9: the narrow update measured slower on an H200
    model2 = tiny_llama()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2, fused=True)
    cfg2 = co.Config(device="cpu", compute_dtype="bfloat16", device_budget=1_300_000, narrow_grads=True)
    model2, opt2 = co.wrap(model2, cfg2, optimizer=opt2)
    assert opt2.narrows()  # asked for, and exact here


def test_one_upcast_buffer_per_stepping_thread_whatever_the_blocks():
    import threading

    first = flatstep._upcast_buffer(flatstep.UPCAST_CHUNK + 5)
    assert flatstep._upcast_buffer(1000) is first  # every block stepped on this thread reuses it
    assert first.numel() == flatstep.UPCAST_CHUNK
    other: list = []
    worker = threading.Thread(target=lambda: other.append(flatstep._upcast_buffer(1000)))
    worker.start()
    worker.join()
    assert other[0] is not first and other[0].numel() == 1000  # another thread has its own
