"""One fused step per block over its flat buffers (carina.offload.flatstep): exact, and invisible outside."""

from __future__ import annotations

import copy

import torch
from offload_fixtures import tiny_llama, train_losses

import carina.offload as co

_BUDGET = 1_300_000


def _wrapped(flat: bool = True, groups=None, **cfg_kwargs):
    model = tiny_llama()
    params = groups(model) if groups else model.parameters()
    cfg = co.Config(device="cpu", device_budget=_BUDGET, cpu_optimizer="fused", **cfg_kwargs)
    model, opt = co.wrap(model, cfg, optimizer=torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1))
    opt.flat_updates = flat
    return model, opt


def _flat_count(opt) -> int:
    return sum(f is not None for f in opt._flat.values())


def test_flat_updates_equal_per_parameter_fused_updates_bitwise():
    model, opt = _wrapped(flat=True)
    got = train_losses(model, opt, 5)
    model2, opt2 = _wrapped(flat=False)
    ref = train_losses(model2, opt2, 5)
    assert got == ref
    assert _flat_count(opt) == len(co.handle_of(model).runtime.groups) and _flat_count(opt2) == 0
    opt.synchronize()
    opt2.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(opt.masters, opt2.masters, strict=True))
    sd, sd2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert sd.keys() == sd2.keys()
    for k in sd:
        assert sd[k].keys() == sd2[k].keys()
        assert all(torch.equal(sd[k][name], sd2[k][name]) for name in sd[k])
    # the per-parameter state the user's optimizer holds is a view into the block's flat state
    g = co.handle_of(model).runtime.blocks[0]
    flat = opt._flat[g.index]
    assert opt.state[g.masters[1]]["exp_avg"].data_ptr() == flat.opt.state[flat.param]["exp_avg"][g.slot(1)].data_ptr()


def test_state_dict_round_trip_with_flat_updates_continues_exactly():
    model, opt = _wrapped()
    train_losses(model, opt, 3)
    msd, osd = model.state_dict(), copy.deepcopy(opt.state_dict())
    more = train_losses(model, opt, 2)
    model2, opt2 = _wrapped()
    model2.load_state_dict(msd)
    opt2.load_state_dict(osd)
    assert train_losses(model2, opt2, 2) == more
    assert _flat_count(opt2) == _flat_count(opt) > 0  # rebuilt from the loaded per-parameter state


def test_blocks_whose_parameters_span_param_groups_keep_the_per_parameter_step():
    def decay_groups(model):
        mats = [p for p in model.parameters() if p.dim() >= 2]
        vecs = [p for p in model.parameters() if p.dim() < 2]
        return [{"params": mats}, {"params": vecs, "weight_decay": 0.0}]

    model, opt = _wrapped(groups=decay_groups)
    got = train_losses(model, opt, 3)
    model2, opt2 = _wrapped(flat=False, groups=decay_groups)
    assert got == train_losses(model2, opt2, 3)
    assert _flat_count(opt) == 0  # every block has norms in the second group


def test_nvme_spill_with_flat_updates_is_exact(tmp_path):
    from carina.offload.api import static_profile
    from carina.offload.simulator import BlockPlan, host_bytes

    prof = static_profile(tiny_llama(), co.Config(device="cpu"))
    full, _ = host_bytes(prof, tuple(BlockPlan() for _ in prof.blocks))
    state = sum(b.numel for b in prof.blocks) * 8
    spill = {"host_budget": full - state // 2 + 300_000, "nvme_path": tmp_path, "nvme_budget": 8 << 20}
    model, opt = _wrapped(activations="recompute", **spill)
    got = train_losses(model, opt, 4)
    handle = co.handle_of(model)
    assert handle.plan.counts()["state_on_nvme"] >= 1
    assert not any(opt._flat.get(i) for i in opt.spill)  # spilled blocks hold no flat state in RAM
    assert handle.stats().peak["host"] <= spill["host_budget"]
    model2, opt2 = _wrapped(activations="recompute")
    assert got == train_losses(model2, opt2, 4)
    handle.store.close()
