"""Resident mode: when everything fits the device, carina trains as plain PyTorch would (CPU, device="cpu")."""

from __future__ import annotations

import copy

import pytest
import torch
from offload_fixtures import tiny_llama, token_batches, train_losses

import carina.offload as co
from carina.core.errors import CapacityError
from carina.offload.planner import PlanBudgets, PlanMode, make_plan, resident_plan
from carina.offload.resident import ResidentOptimizer, ResidentRuntime
from carina.offload.runtime import OffloadRuntime
from carina.offload.simulator import BlockProfile, Hardware, ModelProfile, resident_bytes

TOKENS = 2 * 32  # token_batches: 2 sequences of 32 tokens per micro-batch
LAYERS, H, MLP, KV, V = 4, 64, 128, 32, 256  # tiny_llama's shape (kv width = 64 // 4 heads * 2 kv heads)


def _need(item: int = 4) -> int:
    """The resident plan's device bytes for tiny_llama at TOKENS tokens, from the shape by hand."""
    numel = sum(p.numel() for p in tiny_llama().parameters())
    block_act = TOKENS * (item * (6 * H + 2 * KV + 4 * MLP) + 8 * H)
    other_act = TOKENS * V * 4 + TOKENS * H * item  # saved float32 log-softmax, the head's input
    workspace = 3 * 4 * TOKENS * V  # the head's transient float32 copies of the logits
    weights = numel * item + numel * item + 8 * numel  # parameters, gradients, AdamW m and v
    if item != 4:
        weights += 4 * numel + 4 * numel  # float32 masters and their gradients
    return weights + LAYERS * block_act + other_act + workspace


def _cfg(**kw):
    return co.Config(device="cpu", micro_batch_tokens=TOKENS, **kw)


def _plain(steps, *, accum=1, clip=None, sched=False):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5) if sched else None
    losses = train_losses(model, opt, steps, accum=accum, clip=clip, scheduler=scheduler, plain_clip=True)
    return losses, model.state_dict()


def _wrapped(cfg, dtype=None):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return co.wrap(model, cfg, optimizer=opt)


def test_the_plan_is_resident_exactly_when_the_closed_form_bytes_fit():
    need = _need()
    model, opt = _wrapped(_cfg(device_budget=need))
    handle = co.handle_of(model)
    assert isinstance(handle.runtime, ResidentRuntime) and isinstance(opt, ResidentOptimizer)
    plan = handle.plan
    assert plan is not None and plan.mode is PlanMode.RESIDENT
    assert plan.device_peak == need and plan.host_bytes == 0 and plan.nvme_bytes == 0
    assert plan.tier.startswith("resident: everything fits the device, no offload")
    assert plan.summary()["resident_bytes"]["total"] == need

    model, opt = _wrapped(_cfg(device_budget=need - 1))
    handle = co.handle_of(model)
    assert isinstance(handle.runtime, OffloadRuntime)
    train_losses(model, opt, 2)  # the profiling steps, then the offloaded plan
    assert handle.plan is not None and handle.plan.mode is PlanMode.OFFLOAD
    assert handle.plan.summary()["mode"] == "offload"


def test_bf16_compute_counts_float32_masters_beside_the_parameters():
    need = _need(item=2)
    model, _ = _wrapped(_cfg(device_budget=need, compute_dtype="bfloat16"))
    assert co.handle_of(model).plan.device_peak == need
    model, _ = _wrapped(_cfg(device_budget=need - 1, compute_dtype="bfloat16"))
    assert isinstance(co.handle_of(model).runtime, OffloadRuntime)


def test_resident_training_is_plain_pytorch_bit_for_bit_with_accumulation_clipping_and_scheduler():
    ref, ref_state = _plain(4, accum=2, clip=0.5, sched=True)
    model, opt = _wrapped(_cfg(device_budget=_need(), grad_accumulation=2, max_grad_norm=0.5))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    got = train_losses(model, opt, 4, accum=2, scheduler=scheduler)
    assert got == ref
    state = model.state_dict()
    for name, value in ref_state.items():
        assert torch.equal(state[name], value), name
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.25)
    # nothing of the offload machinery: no module hooks, no gradient hooks, no pinned slabs
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert all(not getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
    assert co.handle_of(model).runtime.pinned_bytes == 0


def test_unbudgeted_ten_steps_match_plain_pytorch():
    ref, _ = _plain(10)
    model, opt = _wrapped(_cfg())
    assert co.handle_of(model).plan.mode is PlanMode.RESIDENT
    assert train_losses(model, opt, 10) == ref


@pytest.mark.parametrize("accum", [1, 2])
def test_bf16_resident_matches_offloaded_bf16_training_bitwise(accum):
    """Same semantics either way: bf16 parameters cast from float32 masters, float32 gradient sums, clipping."""
    kw = {"compute_dtype": "bfloat16", "grad_accumulation": accum, "max_grad_norm": 0.5}
    res_model, res_opt = _wrapped(_cfg(**kw))
    off_model, off_opt = _wrapped(_cfg(resident="off", device_budget=1_300_000, **kw))
    assert isinstance(co.handle_of(res_model).runtime, ResidentRuntime)
    assert isinstance(co.handle_of(off_model).runtime, OffloadRuntime)
    got = train_losses(res_model, res_opt, 4, accum=accum)
    ref = train_losses(off_model, off_opt, 4, accum=accum)
    assert got == ref
    assert next(res_model.parameters()).dtype == torch.bfloat16
    ref_state, state = off_model.state_dict(), res_model.state_dict()
    for name, value in ref_state.items():
        assert state[name].dtype == torch.float32 and torch.equal(state[name], value), name


def test_state_dict_round_trip_resumes_bit_for_bit_and_crosses_modes():
    ref, _ = _plain(6)
    model, opt = _wrapped(_cfg())
    first = train_losses(model, opt, 3)
    saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
    batches = token_batches(6)[3:]

    def resume(cfg):
        m, o = _wrapped(cfg)
        model_state, opt_state = copy.deepcopy(saved)  # (torch's load keeps same-device state tensors as given)
        m.load_state_dict(model_state)
        o.load_state_dict(opt_state)
        out = []
        for ids in batches:
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            out.append(loss.item())
            o.step()
            o.zero_grad()
        return out

    assert first + resume(_cfg()) == ref
    assert first + resume(_cfg(resident="off", device_budget=1_300_000)) == ref  # into an offloaded run


def test_unknown_activations_offload_under_auto_and_on_forces_resident():
    model, _ = _wrapped(co.Config(device="cpu"))  # micro_batch_tokens unknown: cannot prove it fits
    assert isinstance(co.handle_of(model).runtime, OffloadRuntime)
    model, _ = _wrapped(co.Config(device="cpu", resident="on"))
    assert co.handle_of(model).plan.mode is PlanMode.RESIDENT
    with pytest.raises(CapacityError, match="resident='on'"):
        _wrapped(_cfg(resident="on", device_budget=_need() - 1))


def _prof(act: int) -> ModelProfile:
    blocks = tuple(BlockProfile(f"b{i}", 2000, 1000, act, 1e-3) for i in range(3))
    return ModelProfile(blocks, 200, 100, 50, 1e-4, head_workspace_bytes=70)


def test_resident_bytes_closed_form_and_make_plan_modes():
    prof = _prof(act=300)
    got = resident_bytes(prof)
    numel = 3100
    assert (got.params, got.masters, got.grads, got.master_grads) == (6200, 4 * numel, 6200, 4 * numel)
    assert got.optimizer_state == 8 * numel and got.activations == 950 and got.head_workspace == 70
    need = got.total
    hw = Hardware(h2d=1e9, d2h=1e9, optim=1e9, disk=1e9)
    assert make_plan(prof, PlanBudgets(device=need, host=None), hw, resident="auto").mode is PlanMode.RESIDENT
    off = make_plan(prof, PlanBudgets(device=need - 1, host=None), hw, resident="auto")
    assert off.mode is PlanMode.OFFLOAD and off.host_bytes > 0
    assert make_plan(prof, PlanBudgets(device=need, host=None), hw).mode is PlanMode.OFFLOAD  # default: off
    assert resident_plan(prof, PlanBudgets(device=None, host=None)) is not None
    with pytest.raises(CapacityError, match="resident='on'"):
        make_plan(prof, PlanBudgets(device=need - 1, host=None), hw, resident="on")


def test_offload_plan_cli_prints_the_resident_mode():
    import json

    from typer.testing import CliRunner

    from carina.cli.app import app

    runner = CliRunner()
    res = runner.invoke(app, ["offload", "plan", "--model", "tiny", "--tokens", "64", "--seq-len", "32",
                              "--device-budget", "1GB", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["mode"] == "resident" and out["tier"].startswith("resident: everything fits the device")
    assert out["bytes"]["host"] == 0 and out["bytes"]["device_peak"] == out["resident_bytes"]["total"]
    res = runner.invoke(app, ["offload", "plan", "--model", "tiny", "--tokens", "64", "--seq-len", "32",
                              "--device-budget", "1GB", "--resident", "off", "--json"])  # fmt: skip
    assert json.loads(res.stdout)["mode"] == "offload"


def test_carina_ckpt_saves_and_restores_a_resident_run(tmp_path):
    from carina.ckpt import Checkpointer, WriterKind
    from carina.ckpt import Config as CkptConfig

    ref, _ = _plain(6)
    model, opt = _wrapped(_cfg())
    first = train_losses(model, opt, 3)
    with Checkpointer(CkptConfig(dir=str(tmp_path), writer=WriterKind.SYNC)) as ckpt:
        ckpt.save(3, {"model": model, "optim": opt})
        ckpt.wait()
    model2, opt2 = _wrapped(_cfg())
    with Checkpointer(CkptConfig(dir=str(tmp_path), writer=WriterKind.SYNC)) as ckpt:
        assert ckpt.restore({"model": model2, "optim": opt2}) == 3
    rest = []
    for ids in token_batches(6)[3:]:
        loss = model2(input_ids=ids, labels=ids).loss
        loss.backward()
        rest.append(loss.item())
        opt2.step()
        opt2.zero_grad()
    assert first + rest == ref
