"""The CUDA path (streams, pinned staging, storage resize): same loop, close to plain GPU training."""

from __future__ import annotations

import pytest
import torch
from offload_fixtures import tiny_llama, train_losses

import carina.offload as co

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("policy", ["plan", "swap", "recompute"])
def test_cuda_offload_tracks_plain_gpu_training(policy):
    ref_model = tiny_llama().cuda()
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-3, foreach=False)
    ref = train_losses(ref_model, ref_opt, 6, device="cuda")

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    model, opt = co.wrap(model, co.Config(device="cuda", device_budget=1_600_000, activations=policy), optimizer=opt)
    got = train_losses(model, opt, 6, device="cuda")
    handle = co.handle_of(model)
    assert handle.runtime.mover.cuda
    assert handle.stats().peak["device"] <= 1_600_000
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=1e-4)


def test_pinned_arena_on_cuda():
    from carina.memory import HostArena

    arena = HostArena(1 << 20)
    assert arena.pinned
    t = arena.alloc((1024,), dtype=torch.float32)
    assert t.is_pinned()
