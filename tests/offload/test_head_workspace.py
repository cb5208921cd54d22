"""The head's transient workspace (logits, upcast, loss gradients) is profiled and planned for."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from offload_fixtures import VOCAB, big_vocab_llama, token_batches, train_losses
from torch import nn

import carina.offload as co
from carina.core.errors import CapacityError, ConfigError
from carina.offload.api import _budgets
from carina.offload.estimate import ShapeEstimate, estimate_profile
from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import Action, BlockPlan, BlockProfile, Hardware, ModelProfile, simulate
from carina.offload.workspace import HeadWorkspace

TOKENS = 2 * 32  # token_batches: 2 sequences of 32
HW = Hardware(20e9, 20e9, 2e9, 1.5e9)


def _batches(n: int) -> list[torch.Tensor]:
    return [b % VOCAB * 13 % VOCAB for b in token_batches(n)]


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    losses = []
    for ids in _batches(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _wrapped(budget: int | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = big_vocab_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return co.wrap(model, co.Config(device="cpu", device_budget=budget), optimizer=opt)


def test_cpu_estimate_is_three_float32_copies_of_the_logits():
    model, opt = _wrapped(None)
    _train(model, opt, 1)
    assert opt.profile is not None
    assert opt.profile.head_workspace_bytes == 3 * 4 * TOKENS * VOCAB
    assert opt.profile.other_act_bytes >= 4 * TOKENS * VOCAB  # the saved float32 log-softmax


def test_budget_without_room_for_the_head_workspace_raises_before_any_update():
    budget = 4_500_000  # blocks, embeddings and saved tensors fit; the logits' workspace does not
    model, opt = _wrapped(budget)
    masters = [m.detach().clone() for m in opt.masters]
    with pytest.raises(CapacityError) as err:
        _train(model, opt, 2)
    assert "head workspace" in str(err.value)
    assert err.value.context["head_workspace"] == 3 * 4 * TOKENS * VOCAB
    assert err.value.context["needed"] > budget
    assert all(torch.equal(a, b) for a, b in zip(masters, opt.masters, strict=True))
    # the same profile without the workspace would have passed: the workspace is what does not fit
    assert opt.profile is not None
    prof = replace(opt.profile, head_workspace_bytes=0)
    assert make_plan(prof, PlanBudgets(device=budget, host=None), HW).device_peak <= budget


def test_budget_with_room_trains_bitwise_like_plain_pytorch():
    budget = 6_600_000
    model = big_vocab_llama()
    ref = _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), 5)
    wrapped, opt = _wrapped(budget)
    assert _train(wrapped, opt, 5) == ref
    handle = co.handle_of(wrapped)
    plan = handle.plan
    assert plan is not None and plan.device_peak <= budget
    assert handle.stats().peak["device"] <= budget
    prof = opt.profile
    assert prof is not None and prof.head_workspace_bytes > 0
    head = next(e for e in simulate(plan.blocks, prof, HW, 1)[0] if e.kind == "head")
    assert head.device_bytes >= prof.head_workspace_bytes + prof.other_act_bytes + 2 * prof.resident_param_bytes


def test_simulated_head_counts_workspace_and_the_last_block_once():
    blocks = tuple(BlockProfile(f"b{i}", 1000, 250, 500, 0.01) for i in range(3))
    base = ModelProfile(blocks, 4000, 1000, 700, 0.001)
    plan = tuple(BlockPlan() for _ in blocks)  # streamed, recomputed: nothing kept

    def head(prof: ModelProfile) -> int:
        return next(e.device_bytes for e in simulate(plan, prof, HW, 1)[0] if e.kind == "head")

    assert head(base) == 2 * 4000 + 700 + 1000  # resident params + grads, saved, the last block's params
    assert head(replace(base, head_workspace_bytes=12345)) == head(base) + 12345
    bwd = [e.device_bytes for e in simulate(plan, replace(base, head_workspace_bytes=12345), HW, 1)[0]]
    assert bwd[-3:] == [e.device_bytes for e in simulate(plan, base, HW, 1)[0]][-3:]  # gone in backward


def test_simulated_head_counts_kept_activations_but_not_swapped_ones():
    blocks = tuple(BlockProfile(f"b{i}", 1000, 250, 500, 0.01) for i in range(3))
    prof = ModelProfile(blocks, 4000, 1000, 700, 0.001)

    def head(last: Action) -> int:
        plan = (BlockPlan(), BlockPlan(), BlockPlan(activation=last))
        return next(e.device_bytes for e in simulate(plan, prof, HW, 1)[0] if e.kind == "head")

    # swapped activations come back during the block's backward, not while the head runs
    assert head(Action.SWAP) == head(Action.RECOMPUTE)
    assert head(Action.KEEP) == head(Action.RECOMPUTE) + 500


def test_cuda_workspace_is_the_measured_peak_beyond_the_simulated_head():
    probe = HeadWorkspace(torch.device("cpu"))
    probe.cuda, probe.peak = True, 10_000  # as the allocator would have reported
    assert probe.workspace(7_500) == 2_500
    assert probe.workspace(12_000) == 0
    probe.cuda = False
    probe.open()
    probe.note_output(torch.zeros(3, 5, dtype=torch.bfloat16))
    probe.note_output(torch.zeros(3, dtype=torch.long))  # not logits
    probe.close()
    probe.note_output(torch.zeros(100, 100))  # outside the window: ignored
    assert probe.workspace(0) == 3 * 4 * 15


def test_static_estimate_plans_for_the_logits_of_the_h100_failure():
    from carina.offload.models import model_config

    cfg = model_config("llama-1b", vocab_size=32000, intermediate_size=5504, num_attention_heads=16)
    prof = estimate_profile(cfg, ShapeEstimate(tokens=8192, seq_len=2048, tflops=400, dtype_bytes=2))
    fp32_logits = 8192 * 32000 * 4  # the 1000 MiB allocation that failed
    assert prof.head_workspace_bytes == 3 * fp32_logits
    assert prof.other_act_bytes >= fp32_logits
    budget = int(6 * 2**30 * 0.95)
    plan = make_plan(prof, PlanBudgets(device=budget, host=None), HW)
    head = next(e for e in simulate(plan.blocks, prof, HW, 1)[0] if e.kind == "head")
    assert head.device_bytes >= 4 * fp32_logits and plan.device_peak <= budget


def test_allocator_headroom_is_held_back_on_cuda_only():
    cfg = co.Config(device="cpu", device_budget=1_000_000, allocator_headroom=0.25)
    assert _budgets(cfg, torch.device("cpu")).device == 1_000_000
    assert _budgets(cfg, torch.device("cuda", 0)).device == 750_000
    assert co.Config().allocator_headroom == 0.05
    with pytest.raises(ConfigError) as err:
        co.Config(allocator_headroom=0.95)
    assert err.value.context["key"] == "allocator_headroom"


def test_a_tensor_saved_twice_outside_blocks_is_counted_once():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x * x  # mul saves x as both operands

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = co.wrap(net, co.Config(device="cpu", blocks=["layers"]), optimizer=opt)
    net(torch.randn(8, 16)).sum().backward()
    assert co.handle_of(net).runtime.other_act_bytes == 8 * 16 * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_cuda_measures_the_head_workspace_from_the_allocator_peak():
    model = big_vocab_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = co.wrap(model, co.Config(device="cuda", device_budget=64 << 20), optimizer=opt)
    train_losses(model, opt, 2, device="cuda")  # the profiling steps
    handle = co.handle_of(model)
    assert opt.profile is not None  # at least the loss's float32 gradient of the logits
    assert opt.profile.head_workspace_bytes >= 4 * TOKENS * VOCAB
    assert handle.plan is not None and handle.plan.device_peak <= int((64 << 20) * 0.95)
