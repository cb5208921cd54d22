"""Host memory carina takes beside its plan: the profiling steps' pinned cache and swap allowance, the plan's probes.

The H100 run of session 13 (7B shape cut to 16 layers, bf16, 36 GiB host budget, NVMe) peaked at 39.65 GiB of
RSS for a plan of 35.98 GiB. Its first profiling step always swaps the first block's activations to pinned host
RAM (1.5 GB at 8k tokens); PyTorch kept those pinned blocks cached until the plan was applied, through the second
profiling step, when the optimizer state made by the first step's updates was already in RAM.
"""

from __future__ import annotations

import pytest
import torch
from offload_fixtures import tiny_llama, token_batches

import carina.offload as co
from carina.offload import profiler
from carina.offload.api import _NOMINAL, pinned_slack, static_profile
from carina.offload.hostmem import PinnedSlabs, slab_plan, slab_size
from carina.offload.planner import PlanBudgets, make_plan

GIB = 1 << 30


def _llama_7b_16l():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):  # shapes only: nothing is allocated
        return LlamaForCausalLM(cfg)


def test_the_static_plan_counts_the_pinned_slabs_tails():
    # wrap's static plan rejects impossible budgets and sets what profiling may swap (the budget less its host
    # bytes); without the tails it left 0.46 GB where 16 MB was left. The s13 H100 configuration
    # (benchmarks/offload/peers preset h200-7b16l-spill, as run_carina sets it):
    model = _llama_7b_16l()
    cfg = co.OffloadConfig(device="cpu", compute_dtype="bfloat16", host_budget=36 * GIB, nvme_path="/var/tmp/x",
                           nvme_budget=66289819648)  # fmt: skip
    budgets = PlanBudgets(device=int(int(0.9 * 24 * GIB) * 0.95), host=36 * GIB, nvme=66289819648)

    def plan(pinned: bool):
        prof = static_profile(model, cfg, 8, 4, pinned=pinned)
        return prof, make_plan(prof, budgets, _NOMINAL, policy="recompute", prefetch_depth=1, cast="device")

    _, old = plan(pinned=False)
    prof, new = plan(pinned=True)
    slack = prof.host_fixed_bytes
    assert slack == pinned_slack(model, cfg) == 2062516224  # 7 slabs of 4 GiB for 28.0 GB of buffers
    # without the tails: 12 blocks spilled, which do not fit with the tails
    assert sum(b.state_on_nvme for b in old.blocks) == 12
    assert old.host_bytes <= 36 * GIB < old.host_bytes + slack
    # with them: 13 blocks, the host bytes of the plan the H100 made after profiling, within the budget
    assert sum(b.state_on_nvme for b in new.blocks) == 13
    assert new.host_bytes == 38638223948 <= 36 * GIB


def test_pinned_slack_is_what_the_runtimes_slabs_leave_unused():
    model = tiny_llama(layers=6)
    cfg = co.OffloadConfig(device="cpu", compute_dtype="bfloat16")
    from carina.memory.store import TensorStore, TierBudgets
    from carina.offload.blocks import HostLayout, find_blocks, host_buffer_sizes, partition

    sizes = host_buffer_sizes(partition(model, find_blocks(model, [])), torch.bfloat16, HostLayout(staging=False,
                              host_copy=False))  # fmt: skip
    slabs = PinnedSlabs(TensorStore(TierBudgets(), device="cpu"), slab_size(sizes), pin="off", plan=slab_plan(sizes))
    for n in sizes:  # as build_groups carves them
        slabs.empty((n,), torch.uint8, "buffer")
    assert pinned_slack(model, cfg) == slabs.reserved - slabs.carved > 0


@pytest.mark.parametrize(("numel", "per", "room", "want"), [
    (1 << 25, 24, None, 1 << 25),  # no budget: as asked
    (1 << 25, 24, 24 << 20, 1 << 20),  # 24 MiB of room at 24 B per element
    (1 << 25, 24, 0, profiler.PROBE_MIN),  # never below the floor
    (1000, 4, 1 << 30, profiler.PROBE_MIN),
    (1 << 20, 4, -5, profiler.PROBE_MIN),  # over budget already
])  # fmt: skip
def test_probe_numel_fits_the_room(numel, per, room, want):
    assert profiler.probe_numel(numel, per, room) == want


def test_the_plans_probes_take_at_most_the_room_the_host_budget_leaves(monkeypatch):
    asked: list[tuple[str, int]] = []
    monkeypatch.setattr(
        profiler, "_optimizer_rate", lambda opt, numel, threads=0: asked.append(("optim", numel)) or 1e9
    )
    monkeypatch.setattr(profiler, "_pass_rate", lambda kind, dt, numel, threads=0: asked.append((kind, numel)) or 1e9)
    monkeypatch.setattr(profiler, "_host_pass_rate", lambda numel, threads=0: asked.append(("host", numel)) or 1e10)
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([p])
    cfg = co.OffloadConfig(device="cpu", h2d_gbps=10.0, d2h_gbps=10.0)
    room = 48 << 20
    profiler.measure_hardware(torch.device("cpu"), cfg, opt, block_numel=202383360, compute_dtype=torch.bfloat16,
                              host_room=room)  # fmt: skip
    per = {"optim": profiler.OPTIM_PROBE_OVERHEAD + 8, "fold": 6, "cast": 6, "host": 4}
    assert {k for k, _ in asked} == {"optim", "fold", "cast", "host"}
    for kind, numel in asked:
        assert numel * per[kind] <= room, kind
    assert dict(asked)["optim"] == room // 24  # as large as the room allows, not the 2**25 of old
    asked.clear()
    profiler.measure_hardware(torch.device("cpu"), cfg, opt, block_numel=202383360, compute_dtype=torch.bfloat16)
    assert dict(asked)["optim"] == profiler.OPTIM_PROBE_MAX  # no host budget: unchanged


def test_each_profiling_step_gives_the_pinned_cache_back_before_its_updates(tmp_path):
    # profiling swaps activations to (pinned) host RAM; PyTorch caches the freed pinned blocks. The first
    # step's updates make the optimizer state: the cache must be empty by then, and at every later profiling step
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = co.Config(device="cpu", device_budget=1_300_000, activations="recompute", profile_steps=3)
    model, opt = co.wrap(model, cfg, optimizer=opt)
    rt = co.handle_of(model).runtime
    events: list[tuple[str, int]] = []
    release, step_group = rt.release_pinned_cache, opt.step_group
    rt.release_pinned_cache = lambda: events.append(("release", opt.steps)) or release()
    opt.step_group = lambda g, options=None: events.append(("update", opt.steps)) or step_group(g, options)
    for ids in token_batches(4):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    for step in range(cfg.profile_steps):
        mine = [e for e, k in events if k == step]
        assert "update" in mine and mine.index("release") < mine.index("update"), (step, mine)
