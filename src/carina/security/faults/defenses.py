"""Cheap fault detectors, run as stage hooks alongside injection.

* **range**: each stage's accumulator outputs must stay inside the range seen on
  fault-free frames (profiled), widened by a margin;
* **abft**: algorithm-based fault tolerance on the 1x1 convolutions (96 % of
  SkyNet's MACs): the sum over output channels must equal one extra convolution
  with the channel-summed weights (one output channel more: 1/C_out overhead);
* **temporal** (evaluated by the campaign): on a static scene the box must not
  jump (IoU with the previous frame's box >= 0.5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from carina.security.faults.fixedpoint import ACCUMULATOR
from carina.security.faults.skynet import Numeric, SkyNet, blocked_matmul, conv, exact_blocks

if TYPE_CHECKING:
    import torch

__all__ = ["DETECTORS", "Detectors", "overheads"]

DETECTORS = ("range", "abft", "temporal")


def overheads(model: SkyNet) -> dict[str, float]:
    """Extra work of each detector as a fraction of the frame's MACs (modelled, not timed)."""
    total = float(sum(model.macs))
    abft = sum(s.macs / s.weight.shape[0] for s in model.stages if s.groups == 1)
    outputs = sum(s.out_shape[0] * s.out_shape[1] * s.out_shape[2] for s in model.stages)
    return {"range": 2 * outputs / total, "abft": abft / total, "temporal": 0.0}


@dataclass
class Detectors:
    """Range and ABFT checks for one batch; ``flags[name]`` is a (B,) bool tensor after a forward."""

    model: SkyNet
    margin: float = 0.05
    bounds: dict[int, tuple[float, float]] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    _exact: dict[int, Any] = field(default_factory=dict, repr=False)

    def profile(self, x: torch.Tensor) -> None:
        """Record each stage's accumulator range on fault-free inputs ``x``."""
        saved = self.model.hooks
        self.model.hooks = self.recorder()
        try:
            self.model.run(x)
        finally:
            self.model.hooks = saved

    def recorder(self) -> dict[int, Callable[..., Any]]:
        """Hooks that record accumulator ranges (into :attr:`bounds`) during a fault-free run."""

        def rec(i: int, acc: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
            lo, hi = float(acc.min()), float(acc.max())
            old = self.bounds.get(i, (lo, hi))
            self.bounds[i] = (min(lo, old[0]), max(hi, old[1]))
            return acc

        return {i: rec for i in range(len(self.model.stages))}

    def wrap(self, inner: dict[int, Callable[..., Any]], batch: int) -> dict[int, Callable[..., Any]]:
        """Hooks that apply ``inner`` (the faults) first, then check; resets :attr:`flags`."""
        import torch

        dev = self.model._w[0].device
        self.flags = {name: torch.zeros(batch, dtype=torch.bool, device=dev) for name in ("range", "abft")}

        def hook(i: int, acc: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            # A flag is an OR over stages: once every row has it, later checks cannot change it.
            if i in inner:
                acc = inner[i](i, acc, x)
            if not bool(self.flags["range"].all()):
                self._check_range(i, acc)
            if self.model.stages[i].groups == 1 and not bool(self.flags["abft"].all()):
                self._check_abft(i, acc, x)
            return acc

        return {i: hook for i in range(len(self.model.stages))}

    def _blocks(self, i: int, wsum: torch.Tensor, x: torch.Tensor) -> list[tuple[int, int]] | None:
        """Exact float32 channel blocks of stage ``i``'s checksum (fixed point in float32 only)."""
        import torch

        fixed32 = self.model.numeric is Numeric.FIXED and x.dtype == torch.float32
        # a float32 channel sum of <= 2**12 accumulators of 12 bits stays below 2**24 steps
        if not fixed32 or self.model.stages[i].weight.shape[0] > 1 << 12:
            return None
        if i not in self._exact:
            self._exact[i] = exact_blocks(wsum)
        return self._exact[i]

    def _check_range(self, i: int, acc: torch.Tensor) -> None:
        import torch

        lo, hi = self.bounds[i]
        pad = self.margin * (hi - lo)
        b = acc.shape[0]
        low, high = torch.aminmax(acc.reshape(b, -1), dim=1)  # one pass
        bad = (high > hi + pad) | (low < lo - pad)
        self.flags["range"] |= bad

    def _check_abft(self, i: int, acc: torch.Tensor, x: torch.Tensor) -> None:
        # Exact for fixed-point values, so the flags are the same on every device: float64, or
        # float32 where that is provably exact (channel sums of 12-bit accumulators; checksum
        # products over channel blocks from exact_blocks, summed in float64).
        w = self.model._w[i].double()
        wsum = w.sum(0, keepdim=True)
        blocks = self._blocks(i, wsum, x)
        if blocks is not None:
            expected = blocked_matmul(x, wsum.to(x.dtype), blocks).double()
            observed = acc.sum(1, keepdim=True).double()
        else:
            expected = conv(x.double(), wsum)
            observed = acc.double().sum(1, keepdim=True)
        cout = w.shape[0]
        if self.model.numeric is Numeric.FIXED:  # each output rounded by at most half a step
            tol = cout * ACCUMULATOR.step / 2 + 1e-6 * cout
        else:
            tol = 1e-4 * float(acc.abs().amax()) * cout + 1e-9
        b = acc.shape[0]
        self.flags["abft"] |= (observed - expected).abs().reshape(b, -1).amax(1) > tol
