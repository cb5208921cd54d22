"""Fault injection by hooks: bit flips on accumulator outputs of the layers running in a time window.

A frame's layers run one after another; each takes a share of the frame time
proportional to its MACs (1 ms at 25 FPS is 2.5 % of a frame). A :class:`Window`
selects the layers it overlaps and, per layer, the fraction of its outputs
produced inside the window (the first ones, in output-channel order, as the
accelerator writes them). Flips are drawn per image, layer and bit from a
generator seeded by ``(seed, image id, layer, bit)``, from one uniform per output:
a bit flips where ``u < p_b``. So results are deterministic for a given input and
seed, and the flips at a lower probability are a subset of those at a higher one.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from carina.core.errors import ConfigError
from carina.security.faults.fixedpoint import ACCUMULATOR, FixedType

if TYPE_CHECKING:
    import torch

__all__ = ["LayerFault", "Window", "WindowKind", "apply_flips", "attach_module_hooks", "plan_window", "skynet_hooks"]


class WindowKind(enum.Enum):
    """Global (the whole frame) or local (a time slice of it)."""

    GLOBAL = "global"
    LOCAL = "local"


@dataclass(frozen=True)
class Window:
    """When the faulty operating point is applied within a frame.

    ``parse("global")``, ``parse("local:1@20")`` (1 ms starting 20 ms into the frame).
    """

    kind: WindowKind = WindowKind.GLOBAL
    start_ms: float = 0.0
    duration_ms: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Window:
        """Parse ``global`` or ``local:<duration_ms>@<start_ms>``."""
        if text == "global":
            return cls()
        try:
            kind, _, rest = text.partition(":")
            dur, _, start = rest.partition("@")
            if kind != "local":
                raise ValueError(kind)
            return cls(WindowKind.LOCAL, float(start or 0.0), float(dur))
        except ValueError as exc:
            raise ConfigError(f"window {text!r} is not 'global' or 'local:<ms>@<start_ms>'", key="windows") from exc

    def __str__(self) -> str:
        return "global" if self.kind is WindowKind.GLOBAL else f"local:{self.duration_ms:g}@{self.start_ms:g}"


@dataclass(frozen=True)
class LayerFault:
    """Faults of one layer: the fraction of its outputs exposed and the per-bit probabilities."""

    layer: int
    fraction: float
    probs: tuple[float, ...]


def plan_window(window: Window, macs: Sequence[int], frame_ms: float) -> list[tuple[int, float]]:
    """``(layer, exposed fraction)`` for every layer the window overlaps (MAC-proportional timing)."""
    if window.kind is WindowKind.GLOBAL:
        return [(i, 1.0) for i in range(len(macs))]
    total, t, out = float(sum(macs)), 0.0, []
    lo, hi = window.start_ms, window.start_ms + window.duration_ms
    for i, m in enumerate(macs):
        dur = frame_ms * m / total
        overlap = min(hi, t + dur) - max(lo, t)
        if overlap > 0 and dur > 0:
            out.append((i, min(1.0, overlap / dur)))
        t += dur
    return out


def _seed(*parts: int) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def apply_flips(
    acc: torch.Tensor, fault: LayerFault, *, seed: int, image_ids: Sequence[int], fmt: FixedType = ACCUMULATOR
) -> torch.Tensor:
    """``acc`` (B, ...) with bit flips of ``fault`` applied in ``fmt``'s two's-complement codes.

    Values need not already be quantized: the flip adds the code difference times
    the step, so float models get the same error as the fixed-point one.
    """
    import torch

    active = [(b, p) for b, p in enumerate(fault.probs) if p > 0.0]
    if not active or fault.fraction <= 0:
        return acc
    out = acc.clone()
    width, half = 1 << fmt.bits, 1 << (fmt.bits - 1)
    for i, image in enumerate(image_ids):
        flat = out[i].reshape(-1)
        n = round(flat.numel() * fault.fraction)
        if n == 0:
            continue
        codes = fmt.codes(flat[:n]).to(torch.int32)
        xor = torch.zeros(n, dtype=torch.int32)
        for b, p in active:
            if p >= 1.0:  # certain failure: every exposed output, no sampling needed
                xor |= 1 << b
                continue
            gen = torch.Generator().manual_seed(_seed(seed, image, fault.layer, b))
            hit = torch.rand(n, generator=gen, dtype=torch.float32) < p
            xor |= hit.to(torch.int32) << b
        flipped = (codes & (width - 1)) ^ xor
        flipped = torch.where(flipped >= half, flipped - width, flipped)
        flat[:n] += (flipped - codes).to(flat.dtype) * fmt.step
    return out


def skynet_hooks(
    faults: Sequence[LayerFault], *, seed: int, image_ids: Sequence[int]
) -> dict[int, Callable[[int, Any, Any], Any]]:
    """Hooks for :class:`~carina.security.faults.skynet.SkyNet` (``model.hooks = ...``)."""
    by_layer = {f.layer: f for f in faults}

    def hook(i: int, acc: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
        return apply_flips(acc, by_layer[i], seed=seed, image_ids=image_ids)

    return {i: hook for i in by_layer}


def attach_module_hooks(
    modules: Sequence[Any], faults: Sequence[LayerFault], *, seed: int, image_ids: Sequence[int]
) -> list[Any]:
    """Forward hooks on arbitrary ``nn.Module`` s (``faults[k].layer`` indexes ``modules``).

    Returns the handles; call ``.remove()`` on each to detach.
    """
    handles = []
    for f in faults:

        def hook(_mod: Any, _inp: Any, output: torch.Tensor, f: LayerFault = f) -> torch.Tensor:
            return apply_flips(output, f, seed=seed, image_ids=image_ids)

        handles.append(modules[f.layer].register_forward_hook(hook))
    return handles
