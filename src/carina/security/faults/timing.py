"""Timing-fault model: DVFS operating point -> per-bit error probability of accumulator outputs.

A register captures a wrong value when its input path's delay exceeds the clock
period. Delay follows the alpha-power law ``d(V) ~ V / (V - V_th)**alpha``
(Sakurai-Newton); on an adder the carry chain makes the path into bit ``b``
longer for more significant bits, so MSBs fail first and errors are large.
Process variation spreads each path's delay (Gaussian, relative sigma)::

    p_b(V, f) = Phi((d_b(V) - 1/f) / (sigma_rel * d_b(V)))

The critical (MSB) path is calibrated so that it just meets the nominal clock at
``V_nom * (1 - guardband)``. Every parameter is a field of :class:`TimingConfig`
with its source; numbers marked *assumed* are engineering estimates, not
measurements of the SkyNet FPGA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from carina.core.config import Config, require

__all__ = ["OperatingPoint", "TimingConfig", "bit_error_probabilities", "path_delays_ns"]


@dataclass(frozen=True)
class OperatingPoint:
    """A DVFS setting: core voltage (V) and accelerator clock (MHz)."""

    voltage: float
    freq_mhz: float

    @property
    def period_ns(self) -> float:
        """Clock period."""
        return 1000.0 / self.freq_mhz


@dataclass(kw_only=True)
class TimingConfig(Config):
    """Parameters of the delay model, with sources.

    Attributes:
        v_nom: Nominal core voltage, V (Ultra96 / Zynq UltraScale+ VCCINT 0.85 V, Xilinx DS925).
        f_nom_mhz: Nominal accelerator clock, MHz (*assumed* 200 MHz for the SkyNet IP).
        v_th: Transistor threshold voltage, V (*assumed* 0.35 V, 16 nm FinFET class).
        alpha: Velocity-saturation exponent of the alpha-power law (1.3, background note).
        guardband: Fraction of ``v_nom`` that can be removed at ``f_nom`` before the
            critical path fails (0.39: Salami et al., FPGA undervolting guardband).
        bits: Accumulator width (12: ``ap_fixed<12,4>``).
        base_fraction: Share of the MSB path's delay not in the carry chain (*assumed* 0.3).
        sigma_rel: Relative sigma of path delay from process variation (*assumed* 0.03).
        frame_ms: Frame time at the design's frame rate (25 FPS -> 40 ms).
        negligible: Bit probabilities below this are treated as zero (saves sampling).
    """

    v_nom: float = 0.85
    f_nom_mhz: float = 200.0
    v_th: float = 0.35
    alpha: float = 1.3
    guardband: float = 0.39
    bits: int = 12
    base_fraction: float = 0.3
    sigma_rel: float = 0.03
    frame_ms: float = 40.0
    negligible: float = 1e-12

    def validate(self) -> None:
        """Physical ranges."""
        require(self.v_nom > self.v_th > 0, "need v_nom > v_th > 0", key="v_th")
        require(0 < self.guardband < 1 - self.v_th / self.v_nom, "guardband must keep V above v_th", key="guardband")
        require(self.alpha >= 1.0, "alpha must be >= 1", key="alpha")
        require(1 <= self.bits <= 32, "bits in 1..32", key="bits")
        require(0 <= self.base_fraction < 1, "base_fraction in [0, 1)", key="base_fraction")
        require(self.sigma_rel > 0, "sigma_rel must be positive", key="sigma_rel")
        require(self.f_nom_mhz > 0 and self.frame_ms > 0, "f_nom_mhz and frame_ms must be positive", key="f_nom_mhz")

    def _g(self, v: float) -> float:
        return v / (v - self.v_th) ** self.alpha

    def critical_delay_ns(self, voltage: float) -> float:
        """Delay of the MSB path at ``voltage`` (infinite at or below ``v_th``)."""
        if voltage <= self.v_th:
            return math.inf
        v_min = self.v_nom * (1 - self.guardband)
        return (1000.0 / self.f_nom_mhz) * self._g(voltage) / self._g(v_min)


def path_delays_ns(cfg: TimingConfig, voltage: float) -> list[float]:
    """Delay of the path into each accumulator bit, LSB first."""
    crit = cfg.critical_delay_ns(voltage)
    return [crit * (cfg.base_fraction + (1 - cfg.base_fraction) * (b + 1) / cfg.bits) for b in range(cfg.bits)]


def bit_error_probabilities(cfg: TimingConfig, point: OperatingPoint, *, intensity: float = 1.0) -> list[float]:
    """Probability that each accumulator bit (LSB first) is captured wrong at ``point``.

    ``intensity`` k compounds the exposure: ``1 - (1 - p)**k`` (k = 2: "double intensity").
    """
    if intensity < 0:
        raise ValueError("intensity must be >= 0")
    out = []
    for d in path_delays_ns(cfg, point.voltage):
        if math.isinf(d):
            p = 1.0
        else:
            z = (d - point.period_ns) / (cfg.sigma_rel * d)
            p = 0.5 * math.erfc(-z / math.sqrt(2.0))
        p = 1.0 - (1.0 - p) ** intensity if p < 1.0 else (1.0 if intensity > 0 else 0.0)
        out.append(p if p >= cfg.negligible else 0.0)
    return out
