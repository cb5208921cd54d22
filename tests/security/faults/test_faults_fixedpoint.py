"""ap_fixed emulation: rounding (ties up), saturation, two's-complement flips, and the released fixed weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from carina.security.faults.fixedpoint import ACCUMULATOR, FEATURE, WEIGHT, FixedType


def test_rounding_and_saturation() -> None:
    step = FEATURE.step  # ap_fixed<9,3>: 6 fraction bits
    x = torch.tensor([step / 2, -step / 2, 1.5 * step, -1.5 * step, 0.3 * step, 10.0, -10.0], dtype=torch.float64)
    assert FEATURE.quantize(x).tolist() == [step, 0.0, 2 * step, -step, 0.0, FEATURE.max, FEATURE.min]
    assert (FEATURE.min, FEATURE.max) == (-4.0, 4.0 - 1 / 64)
    assert (ACCUMULATOR.min, ACCUMULATOR.max, ACCUMULATOR.step) == (-8.0, 8.0 - 1 / 256, 1 / 256)
    assert (WEIGHT.min, WEIGHT.max, WEIGHT.step) == (-8.0, 8.0 - 1 / 128, 1 / 128)
    assert str(ACCUMULATOR) == "ap_fixed<12,4>"


@given(st.integers(-2048, 2047), st.integers(0, 11))
def test_flip_is_twos_complement(code: int, bit: int) -> None:
    t = torch.tensor([float(code)])
    once = ACCUMULATOR.flip(t, bit, torch.tensor([True]))
    want = (code & 0xFFF) ^ (1 << bit)
    want = want - 4096 if want >= 2048 else want
    assert once.item() == want
    assert ACCUMULATOR.flip(once, bit, torch.tensor([True])).item() == code
    assert ACCUMULATOR.flip(t, bit, torch.tensor([False])).item() == code


def test_flip_rejects_bits_outside_the_type() -> None:
    with pytest.raises(ValueError, match="outside"):
        FixedType(4, 2).flip(torch.zeros(1), 4, torch.ones(1, dtype=torch.bool))


def test_folded_weights_match_the_released_fixed_point_file(stages, skynet_dir) -> None:
    # weights_fixed.bin holds 11-bit codes (ap_fixed<11,4>); it starts with dw1's 1x1
    # weights, first tile of 32 outputs, [in][out] order: BN folding + WEIGHT rounding
    # of the float weights reproduce them exactly.
    raw = np.fromfile(skynet_dir / "weights_fixed.bin", dtype="<u2").astype(np.int64)
    codes = np.where(raw >= 1024, raw - 2048, raw)
    pw = stages[1].weight[:, :, 0, 0]  # (48 out, 3 in)
    ours = WEIGHT.codes(pw).to(torch.int64).T[:, :32].reshape(-1).numpy()
    assert np.array_equal(ours, codes[:96])
