"""The wrap contract: errors before work, state dicts, budgets, non-HF modules."""

from __future__ import annotations

import copy

import pytest
import torch
from offload_fixtures import tiny_llama, token_batches, train_losses
from torch import nn

import carina.offload as co
from carina.core.errors import CapacityError, ConfigError


def test_plan_that_cannot_fit_raises_before_any_work():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(CapacityError) as err:
        co.wrap(model, co.Config(device="cpu", device_budget=100_000), optimizer=opt)
    assert err.value.context["tier"] == "device"
    assert "at least" in str(err.value)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    with pytest.raises(CapacityError) as err:
        co.wrap(model, co.Config(device="cpu", host_budget=1_000_000), optimizer=opt)
    assert err.value.context["tier"] == "host"


def test_activation_capacity_error_comes_before_the_first_update():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # parameters fit (static check passes), activations of 2x32 tokens do not
    model, opt = co.wrap(model, co.Config(device="cpu", device_budget=950_000, activations="keep"), optimizer=opt)
    masters = [m.detach().clone() for m in opt.masters]
    with pytest.raises(CapacityError):
        train_losses(model, opt, 3)
    assert all(torch.equal(a, b) for a, b in zip(masters, opt.masters, strict=True))


def test_state_dict_roundtrip_restores_training_exactly():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = co.wrap(model, co.Config(device="cpu", device_budget=1_300_000), optimizer=opt)
    train_losses(model, opt, 3)
    msd, osd = model.state_dict(), copy.deepcopy(opt.state_dict())  # torch's state_dict aliases live state
    more = train_losses(model, opt, 2)

    model2 = tiny_llama(seed=5)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    model2, opt2 = co.wrap(model2, co.Config(device="cpu", device_budget=1_300_000), optimizer=opt2)
    result = model2.load_state_dict(msd)
    assert not result.missing_keys and not result.unexpected_keys
    opt2.load_state_dict(osd)
    assert train_losses(model2, opt2, 2) == more


def test_generic_module_with_named_blocks():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(16, 32)
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(5))
            self.out = nn.Linear(32, 4)

        def forward(self, x):
            x = self.inp(x)
            for layer in self.layers:
                x = x + layer(x)
            return self.out(x)

    def run(wrapped):
        torch.manual_seed(0)
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        if wrapped:
            net, opt = co.wrap(net, co.Config(device="cpu", blocks=["layers"], activations="swap"), optimizer=opt)
        gen = torch.Generator().manual_seed(3)
        out = []
        for _ in range(5):
            x = torch.randn(8, 16, generator=gen)
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    assert run(True) == run(False)


def test_bad_inputs_are_config_errors():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(ConfigError):
        co.Config(device="tpu")
    with pytest.raises(ConfigError):
        co.Config(overlap="backward", max_grad_norm=1.0)
    with pytest.raises(ConfigError):
        co.Config(nvme_budget=1 << 20)
    with pytest.raises(ConfigError):
        co.wrap(model, co.Config(device="cpu", blocks=["nope"]), optimizer=opt)
    foreign = torch.optim.AdamW([nn.Parameter(torch.zeros(3))], lr=1e-2)
    with pytest.raises(ConfigError):
        co.wrap(tiny_llama(), co.Config(device="cpu"), optimizer=foreign)


def test_inference_under_no_grad_works_and_releases_blocks():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = co.wrap(model, co.Config(device="cpu", device_budget=1_300_000), optimizer=opt)
    ids = token_batches(1)[0]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    ref = tiny_llama()
    with torch.no_grad():
        assert torch.equal(logits, ref(input_ids=ids).logits)
    rt = co.handle_of(model).runtime
    assert sum(g.on_device for g in rt.blocks) <= 1  # only the last block stays for a backward
