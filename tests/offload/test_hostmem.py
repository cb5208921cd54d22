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
