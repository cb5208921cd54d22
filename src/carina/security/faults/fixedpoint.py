"""Emulation of Vivado HLS ``ap_fixed<W, I, AP_RND, AP_SAT>`` types in torch.

A value of type ``ap_fixed<W, I>`` is a W-bit two's-complement integer ``q``
scaled by ``2**-(W - I)``. ``AP_RND`` rounds to the nearest step with ties
toward +infinity (``floor(x * 2**F + 0.5)``); ``AP_SAT`` clamps to
``[-2**(W-1), 2**(W-1) - 1]`` steps. SkyNet's accelerator uses features
``ap_fixed<9,3>``, accumulators ``ap_fixed<12,4>`` and weights ``ap_fixed<11,4>``
(``FPGA/HLS/net_hls.h`` of the SkyNet repository).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ACCUMULATOR", "FEATURE", "WEIGHT", "FixedType"]


@dataclass(frozen=True)
class FixedType:
    """``ap_fixed<bits, int_bits, AP_RND, AP_SAT>``."""

    bits: int
    int_bits: int

    @property
    def frac_bits(self) -> int:
        """Bits after the binary point."""
        return self.bits - self.int_bits

    @property
    def step(self) -> float:
        """Value of one least significant bit."""
        return 2.0**-self.frac_bits

    @property
    def qmin(self) -> int:
        """Smallest integer code."""
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        """Largest integer code."""
        return (1 << (self.bits - 1)) - 1

    @property
    def min(self) -> float:
        """Smallest representable value."""
        return self.qmin * self.step

    @property
    def max(self) -> float:
        """Largest representable value."""
        return self.qmax * self.step

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """Integer codes of ``x`` after rounding (ties up) and saturation (same dtype as ``x``)."""
        import torch

        return torch.clamp(torch.floor(x * (1 << self.frac_bits) + 0.5), self.qmin, self.qmax)

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded and saturated to this type, as real values (a new tensor; ``x`` is kept)."""
        q = x * (1 << self.frac_bits)
        return q.add_(0.5).floor_().clamp_(self.qmin, self.qmax).mul_(self.step)

    def flip(self, codes: torch.Tensor, bit: int, mask: torch.Tensor) -> torch.Tensor:
        """Codes with ``bit`` inverted where ``mask`` is true (two's complement, ``bits`` wide)."""
        import torch

        if not 0 <= bit < self.bits:
            raise ValueError(f"bit {bit} outside a {self.bits}-bit type")
        width = 1 << self.bits
        unsigned = torch.remainder(codes, width)
        weight = float(1 << bit)
        has = torch.remainder(torch.floor(unsigned / weight), 2) == 1
        flipped = torch.where(has, unsigned - weight, unsigned + weight)
        unsigned = torch.where(mask, flipped, unsigned)
        return torch.where(unsigned > self.qmax, unsigned - width, unsigned)

    def __str__(self) -> str:
        return f"ap_fixed<{self.bits},{self.int_bits}>"


FEATURE = FixedType(9, 3)
ACCUMULATOR = FixedType(12, 4)
WEIGHT = FixedType(11, 4)
