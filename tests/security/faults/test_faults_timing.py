"""The DVFS delay model: monotone in slack, MSBs first, zero at nominal, intensity compounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carina.core.errors import ConfigError
from carina.security.faults.timing import OperatingPoint, TimingConfig, bit_error_probabilities

CFG = TimingConfig()
volts = st.floats(0.36, 1.0)
freqs = st.floats(50.0, 600.0)


@given(volts, volts, freqs)
def test_more_voltage_never_raises_error_probability(v1: float, v2: float, f: float) -> None:
    lo, hi = sorted((v1, v2))
    p_lo = bit_error_probabilities(CFG, OperatingPoint(lo, f))
    p_hi = bit_error_probabilities(CFG, OperatingPoint(hi, f))
    assert all(a >= b for a, b in zip(p_lo, p_hi, strict=True))


@given(volts, freqs, freqs)
def test_slower_clock_never_raises_error_probability(v: float, f1: float, f2: float) -> None:
    slow, fast = sorted((f1, f2))
    p_slow = bit_error_probabilities(CFG, OperatingPoint(v, slow))
    p_fast = bit_error_probabilities(CFG, OperatingPoint(v, fast))
    assert all(a <= b for a, b in zip(p_slow, p_fast, strict=True))


@given(volts, freqs, st.floats(0.0, 4.0), st.floats(0.0, 4.0))
def test_msb_first_and_intensity_compounds(v: float, f: float, k1: float, k2: float) -> None:
    p = bit_error_probabilities(CFG, OperatingPoint(v, f))
    assert p == sorted(p)  # longer carry path -> no lower probability
    lo, hi = sorted((k1, k2))
    a = bit_error_probabilities(CFG, OperatingPoint(v, f), intensity=lo)
    b = bit_error_probabilities(CFG, OperatingPoint(v, f), intensity=hi)
    assert all(x <= y for x, y in zip(a, b, strict=True))


def test_nominal_and_guardband_edges() -> None:
    assert set(bit_error_probabilities(CFG, OperatingPoint(0.85, 200.0))) == {0.0}
    at_edge = bit_error_probabilities(CFG, OperatingPoint(0.85 * (1 - 0.39), 200.0))
    assert at_edge[-1] == pytest.approx(0.5)  # the MSB path exactly meets the clock
    assert set(bit_error_probabilities(CFG, OperatingPoint(0.3, 200.0))) == {1.0}
    assert set(bit_error_probabilities(CFG, OperatingPoint(0.5, 200.0), intensity=0)) == {0.0}
    with pytest.raises(ConfigError):
        TimingConfig(v_th=0.9)
