"""Pinned slabs: the groups' host buffers cost their own bytes, not the next power of two."""

from __future__ import annotations

import itertools

import torch

from carina.memory.store import TensorStore, TierBudgets
from carina.offload.hostmem import PinnedSlabs, slab_size

MiB = 1 << 20


def test_slab_size_is_a_power_of_two_holding_the_largest_buffer():
    block = 202_383_360  # a 7B-shape decoder layer's parameters
    sizes = [4 * block, 4 * block, 2 * block, 2 * block] * 16
    assert slab_size(sizes) == 1 << 31
    assert slab_size([3 * MiB]) == 4 * MiB
    assert slab_size([]) == 4096


def test_buffers_are_carved_first_fit_and_charged_exactly():
    store = TensorStore(TierBudgets(device=None, host=None))
    sizes = [40 * MiB, 40 * MiB, 20 * MiB, 20 * MiB] * 3  # float32/float32/bf16/bf16 of 10 Mi params
    slabs = PinnedSlabs(store, slab_size(sizes), pin="off")
    assert slabs.slab == 64 * MiB
    views = []
    for nbytes in sizes:
        dtype = torch.float32 if nbytes == 40 * MiB else torch.bfloat16
        views.append(slabs.empty((nbytes // (4 if dtype == torch.float32 else 2),), dtype, "buffer"))
    assert store.stats().used["host"] == sum(sizes)  # the ledger holds exact bytes
    # 360 MiB of buffers in 64 MiB slabs (a 40 and a 20 MiB buffer each): 384 MiB, where one pinned
    # tensor per buffer (rounded to a power of two by PyTorch's pinned allocator) would hold 576 MiB
    assert slabs.reserved == 6 * 64 * MiB
    ptrs = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()) for v in views)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ptrs))  # no overlap
    big = slabs.empty((200 * MiB,), torch.uint8, "larger than a slab")
    assert big.numel() == 200 * MiB and slabs.reserved == 6 * 64 * MiB + 256 * MiB


def test_slab_plan_pins_a_7b_blocks_buffers_within_a_few_percent():
    from carina.offload.hostmem import slab_plan

    block, rest = 4 * 202_383_360, 4 * 262_148_096  # float32 masters/gradients: a 7B-shape layer, the rest
    one_micro = [block, block] * 16 + [rest, rest]  # 16 layers, gradients folded on the device
    plan = slab_plan(one_micro)
    # a fixed 2 GiB slab holds two 810 MB buffers: 17 slabs, 36.5 GB for 28.0 GB (session 6 on the H200)
    assert plan == [4 << 30] * 7 and sum(plan) < 1.08 * sum(one_micro)
    staged = [block, block, block // 2] * 16 + [rest, rest, rest // 2]  # + bf16 staging (accumulation)
    assert sum(slab_plan(staged)) < 1.02 * sum(staged)
    assert slab_plan([]) == [] and slab_plan([3 * MiB]) == [4 * MiB]


def test_the_slabs_follow_their_plan_and_pin_what_it_says():
    from carina.offload.hostmem import slab_plan

    store = TensorStore(TierBudgets(device=None, host=None))
    sizes = [12 * MiB, 12 * MiB, 6 * MiB] * 4 + [20 * MiB, 20 * MiB, 10 * MiB]
    plan = slab_plan(sizes)
    slabs = PinnedSlabs(store, slab_size(sizes), pin="off", plan=plan)
    for nbytes in sizes:
        slabs.empty((nbytes,), torch.uint8, "buffer")
    assert [a.capacity + 4096 for a in slabs.arenas] == plan  # the replay matched the carving
    assert slabs.reserved == sum(plan) < 1.25 * sum(sizes)
    assert store.stats().used["host"] == sum(sizes)


def test_the_plan_counts_pinned_rounding_of_swaps_and_the_slabs_tails():
    from carina.offload.hostmem import pinned_cache_bytes
    from carina.offload.simulator import Action, BlockPlan, BlockProfile, ModelProfile, host_bytes

    assert pinned_cache_bytes(180 * MiB) == 256 * MiB and pinned_cache_bytes(64 * MiB) == 64 * MiB
    blocks = (
        BlockProfile("a", 2000, 1000, 5000, 1e-3, swap_host_bytes=8192),
        BlockProfile("b", 2000, 1000, 5000, 1e-3),
    )
    prof = ModelProfile(blocks, 200, 100, 0, 1e-4, host_fixed_bytes=777)
    swap = tuple(BlockPlan(activation=Action.SWAP) for _ in blocks)
    base = 2100 * (4 + 4 + 8)  # masters, gradients, AdamW state
    assert host_bytes(prof, swap) == (base + 777 + 8192 + 5000, 0)  # a: what its swap pinned; b: its saved bytes
    keep = tuple(BlockPlan(activation=Action.KEEP) for _ in blocks)
    assert host_bytes(prof, keep) == (base + 777, 0)


def test_slab_slack_is_the_reserved_bytes_no_buffer_uses():
    from carina.offload.blocks import HostBuffers

    store = TensorStore(TierBudgets(device=None, host=None))
    host = HostBuffers(store, [10 * MiB, 10 * MiB])
    assert host.slabs is None and host.slack_bytes == 0  # no CUDA: the store's host tier, nothing pinned
    slabs = PinnedSlabs(store, 32 * MiB, pin="off", plan=[32 * MiB])
    slabs.empty((10 * MiB,), torch.uint8, "buffer")
    assert slabs.reserved - slabs.carved == 22 * MiB
