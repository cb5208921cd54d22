"""Injection: zero probability is bit-identical, seeds are deterministic, flips nest, windows map to MACs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import ConfigError
from carina.security.faults.fixedpoint import ACCUMULATOR
from carina.security.faults.inject import (
    LayerFault,
    Window,
    apply_flips,
    attach_module_hooks,
    plan_window,
    skynet_hooks,
)
from carina.security.faults.skynet import Numeric, SkyNet


def test_zero_probability_leaves_outputs_bit_identical(stages, images) -> None:
    model = SkyNet(stages, numeric=Numeric.FIXED, dtype=torch.float32)
    x = images[:1]
    golden = model(x)
    again = model(x)
    assert torch.equal(golden, again)  # deterministic fault-free model
    model.hooks = skynet_hooks([LayerFault(i, 1.0, (0.0,) * 12) for i in range(13)], seed=3, image_ids=[0])
    assert torch.equal(model(x), golden)


def _acc(n: int = 4000) -> torch.Tensor:
    return ACCUMULATOR.quantize(torch.randn(2, n, generator=torch.Generator().manual_seed(0)))


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 11), st.integers(0, 5))
def test_flips_at_lower_probability_are_a_subset(p1: float, p2: float, bit: int, seed: int) -> None:
    lo, hi = sorted((p1, p2))
    acc = _acc()
    probs = lambda p: tuple(p if b == bit else 0.0 for b in range(12))  # noqa: E731
    a = apply_flips(acc, LayerFault(0, 1.0, probs(lo)), seed=seed, image_ids=[0, 1]) != acc
    b = apply_flips(acc, LayerFault(0, 1.0, probs(hi)), seed=seed, image_ids=[0, 1]) != acc
    assert not (a & ~b).any()


def test_determinism_and_exposed_fraction() -> None:
    acc = _acc()
    fault = LayerFault(2, 0.25, (0.0,) * 11 + (0.5,))
    one = apply_flips(acc, fault, seed=7, image_ids=[10, 11])
    assert torch.equal(one, apply_flips(acc, fault, seed=7, image_ids=[10, 11]))
    assert not torch.equal(one, apply_flips(acc, fault, seed=8, image_ids=[10, 11]))
    changed = one != acc
    assert changed[:, :1000].any() and not changed[:, 1000:].any()  # only the first quarter is exposed
    assert ((one - acc).abs()[changed] == 8.0).all()  # MSB flip of ap_fixed<12,4> moves by 2**3


def test_windows_map_to_mac_shares(stages) -> None:
    macs = [s.macs for s in stages]
    assert sum(macs) == 463_718_400
    assert plan_window(Window.parse("global"), macs, 40.0) == [(i, 1.0) for i in range(13)]
    plan = plan_window(Window.parse("local:1@20"), macs, 40.0)
    exposed = sum(frac * macs[i] for i, frac in plan) / sum(macs)
    assert exposed == pytest.approx(1 / 40)  # 1 ms of a 40 ms frame
    assert str(Window.parse("local:1@20")) == "local:1@20"
    with pytest.raises(ConfigError):
        Window.parse("burst:3")


def test_any_module_via_forward_hooks() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    clean = net(x)
    handles = attach_module_hooks(
        [net[0], net[2]], [LayerFault(1, 1.0, (0.0,) * 11 + (1.0,))], seed=0, image_ids=[0, 1]
    )
    faulty = net(x)
    for h in handles:
        h.remove()
    assert not torch.allclose(faulty, clean)
    assert torch.equal(net(x), clean)
