"""Fault injection by hooks: bit flips on accumulator outputs of the layers running in a time window.

A frame's layers run one after another; each takes a share of the frame time
proportional to its MACs (1 ms at 25 FPS is 2.5 % of a frame). A :class:`Window`
selects the layers it overlaps and, per layer, the fraction of its outputs
produced inside the window (the first ones, in output-channel order, as the
accelerator writes them). Flips are drawn per image, layer and bit from a
counter-based hash keyed by ``(seed, image id, layer)``: one 32-bit draw per output,
and bit ``b`` flips where the draw is below ``p_b * 2**32`` (the output's delay
variation is shared by its carry chain, so a bit fails only if every slower bit does;
``shared=False`` draws each bit independently, keyed by bit too). Integer
tensor ops only, so the flips are deterministic for a given input and seed, the same
on CPU and CUDA and in any batch, and the flips at a lower probability are a subset of
those at a higher one.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from carina.core.errors import ConfigError
from carina.security.faults import kernels
from carina.security.faults.fixedpoint import ACCUMULATOR, FixedType

if TYPE_CHECKING:
    import torch

__all__ = [
    "ONE", "LayerFault", "Window", "WindowKind", "apply_flip_rows", "apply_flips", "attach_module_hooks",
    "draw_key", "flip_masks", "mix32", "plan_window", "skynet_hooks", "thresholds",
]  # fmt: skip

ONE = 1 << 32  # threshold of a certain flip
_M32 = ONE - 1


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


def thresholds(probs: Sequence[float]) -> tuple[int, ...]:
    """Per-bit probabilities as integer thresholds on a 32-bit uniform (resolution 2**-32).

    ``0`` never flips, ``ONE`` (``2**32``) always flips; a bit flips where its draw ``< t``.
    """
    return tuple(min(ONE, max(0, int(p * ONE + 0.5))) for p in probs)


@functools.lru_cache(maxsize=1 << 16)
def draw_key(seed: int, image: int, layer: int, bit: int) -> int:
    """The 32-bit key of one (seed, image, layer, bit) stream."""
    digest = hashlib.blake2b(repr((seed, image, layer, bit)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash, on int64 tensors holding values in [0, 2**32).

    Multipliers stay below 2**31, so no product overflows int64: the same bits on any device.
    """
    import torch

    return _mix32_(x.clone(), torch.empty_like(x))


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """:func:`mix32` in place, ``tmp`` (same shape) as scratch."""
    import torch

    x.bitwise_xor_(torch.bitwise_right_shift(x, 15, out=tmp))
    x.mul_(0x2C1B3C6D).bitwise_and_(_M32)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 12, out=tmp))
    x.mul_(0x297A2D39).bitwise_and_(_M32)
    return x.bitwise_xor_(torch.bitwise_right_shift(x, 15, out=tmp))


def flip_masks(
    n: int, layer: int, thr: Sequence[Sequence[int]], rows: Sequence[tuple[int, int]], device: Any,
    *, shared: bool = True,
) -> Any:  # fmt: skip
    """XOR masks (B, n) int32 for ``n`` exposed outputs of ``layer`` in each row.

    Args:
        n: Exposed outputs per row (the first ``n`` in channel-major order).
        layer: Stage index (part of the draw key).
        thr: Per row, the bit thresholds from :func:`thresholds`.
        rows: Per row, ``(seed, image id)``.
        device: Where to compute.
        shared: One draw per output for all its bits (the output's path-delay variation is
            shared by its carry chain: a bit fails only if every slower bit fails too), or
            an independent draw per bit. The per-bit rates are the same either way.

    Returns:
        The masks, or None when no bit of any row can flip.
    """
    if not any(any(t) for t in thr):
        return None
    if not shared:
        return _independent_masks(n, layer, thr, rows, device)
    return _shared_masks(0, n, layer, thr, rows, device).expand(len(thr), n).contiguous()


def _shared_masks(
    lo: int, hi: int, layer: int, thr: Sequence[Sequence[int]], rows: Sequence[tuple[int, int]], device: Any
) -> Any:
    """Masks (B, hi - lo) of outputs ``lo..hi`` with one draw per output ((B, 1) when no bit is random).

    Bit b flips where draw < t_b. Over a row's random thresholds sorted (s_0 <= s_1 <= ...),
    with idx = #{j: s_j <= draw} and L_b = #{j: s_j < t_b}, draw < t_b <=> idx <= L_b; so the
    mask is a table lookup by idx: the same masks as one comparison per bit, in fewer passes.
    """
    import torch

    bounds, tables = zip(*(kernels.threshold_table(tuple(ts)) for ts in thr), strict=True)
    k = max(len(x) for x in bounds)
    if k == 0:  # no bit is random: no draws
        return torch.tensor([[t[0]] for t in tables], dtype=torch.int32, device=device)
    pad = [x + (ONE,) * (k - len(x)) for x in bounds]  # ONE is never <= a draw
    tab = [t + (t[-1],) * (k - len(x)) for t, x in zip(tables, bounds, strict=True)]
    keys = torch.tensor([[draw_key(s, i, layer, -1)] for s, i in rows], dtype=torch.int64, device=device)
    draw = _base(hi, device)[:, lo:hi] ^ keys
    _mix32_(draw, torch.empty_like(draw))
    idx = torch.searchsorted(torch.tensor(pad, dtype=torch.int64, device=device), draw, right=True)
    return torch.tensor(tab, dtype=torch.int32, device=device).gather(1, idx)


_BASES: dict[str, Any] = {}


def _base(n: int, device: Any) -> Any:
    """``mix32(arange(m))[None, :]`` for some m >= n, cached per device (read-only; slice it)."""
    import torch

    key = str(device)
    if key not in _BASES or _BASES[key].shape[1] < n:
        _BASES[key] = mix32(torch.arange(n, dtype=torch.int64, device=device))[None, :]
    return _BASES[key]


def _independent_masks(
    n: int, layer: int, thr: Sequence[Sequence[int]], rows: Sequence[tuple[int, int]], device: Any
) -> Any:
    """One draw per bit (``shared=False``): a comparison per random bit."""
    import torch

    xor = torch.zeros((len(thr), n), dtype=torch.int32, device=device)
    for b in range(len(thr[0])):
        col = [t[b] for t in thr]
        if not any(col):
            continue
        if all(t == ONE for t in col):
            xor |= 1 << b
            continue
        keys = [[draw_key(s, i, layer, b)] for s, i in rows]
        draw = mix32(_base(n, device)[:, :n] ^ torch.tensor(keys, dtype=torch.int64, device=device))
        limit = torch.tensor([[t] for t in col], dtype=torch.int64, device=device)
        xor |= (draw < limit).to(torch.int32) << b
    return xor


def apply_flip_rows(
    acc: torch.Tensor, layer: int, fraction: float, thr: Sequence[Sequence[int]], rows: Sequence[tuple[int, int]],
    *, fmt: FixedType = ACCUMULATOR, shared: bool = True, inplace: bool = False, quantized: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``acc`` (B, ...) with each row's bit flips applied in ``fmt``'s two's-complement codes.

    Row ``r`` uses thresholds ``thr[r]`` and draws of ``rows[r] = (seed, image id)``, so one
    batch can mix operating points and seeds; a row's result does not depend on the others.
    Values need not already be quantized: the flip adds the code difference times the step,
    so float models get the same error as the fixed-point one. A new tensor, unless
    ``inplace`` (then the fused CPU kernel, where it applies, writes into ``acc``, and
    when ``acc`` is already ``quantized`` to ``fmt`` rewrites only the flipped outputs).
    """
    if fraction <= 0 or not any(any(t) for t in thr):
        return acc
    flat = acc.reshape(acc.shape[0], -1)
    n = round(flat.shape[1] * fraction)
    if not n:
        return acc
    if shared and kernels.applies(acc):
        # one fused pass per output, the same bits as the torch ops below (test_faults_kernels)
        keys = [draw_key(s, i, layer, -1) for s, i in rows]
        ts = [tuple(t) for t in thr]
        return kernels.flip_rows_cpu(flat, n, keys, ts, fmt, inplace=inplace, quantized=quantized).view_as(acc)
    return _flip_rows_torch(flat, n, layer, thr, rows, fmt, shared=shared).view_as(acc)


def _flip_rows_torch(
    flat: torch.Tensor, n: int, layer: int, thr: Sequence[Sequence[int]], rows: Sequence[tuple[int, int]],
    fmt: FixedType, *, shared: bool,
) -> torch.Tensor:  # fmt: skip
    """:func:`apply_flip_rows` on (B, m) values as torch ops (any device; CUDA's path)."""
    out = flat.clone()
    if not shared:
        _flip_block(out[:, :n], flat[:, :n], _independent_masks(n, layer, thr, rows, flat.device), fmt)
        return out
    # On CPU, blocks of columns keep the temporaries small (in cache, no fresh pages).
    step = max(1, _BLOCK // flat.shape[0]) if flat.device.type == "cpu" else n
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        _flip_block(out[:, lo:hi], flat[:, lo:hi], _shared_masks(lo, hi, layer, thr, rows, flat.device), fmt)
    return out


_BLOCK = 1 << 22  # elements of a block of outputs flipped at once


def _flip_block(out: torch.Tensor, src: torch.Tensor, xor: torch.Tensor, fmt: FixedType) -> None:
    """``out += (flipped code - code) * step`` for values ``src`` and XOR masks ``xor`` (broadcastable)."""
    import torch

    width, half = 1 << fmt.bits, 1 << (fmt.bits - 1)
    q = src * (1 << fmt.frac_bits)
    codes = q.add_(0.5).floor_().clamp_(fmt.qmin, fmt.qmax).to(torch.int32)  # fmt.codes, fewer passes
    # Flipped code minus old code: ((c ^ xor) + half) mod width - half sign-extends the low bits.
    delta = codes.bitwise_xor(xor).add_(half).bitwise_and_(width - 1).sub_(half).sub_(codes)
    out += delta.to(out.dtype).mul_(fmt.step)


def apply_flips(
    acc: torch.Tensor, fault: LayerFault, *, seed: int, image_ids: Sequence[int], fmt: FixedType = ACCUMULATOR,
    shared: bool = True,
) -> torch.Tensor:  # fmt: skip
    """``acc`` (B, ...) with the bit flips of ``fault`` (same for every row) for images ``image_ids``."""
    thr = [thresholds(fault.probs)] * len(image_ids)
    rows = [(seed, i) for i in image_ids]
    return apply_flip_rows(acc, fault.layer, fault.fraction, thr, rows, fmt=fmt, shared=shared)


def skynet_hooks(
    faults: Sequence[LayerFault], *, seed: int, image_ids: Sequence[int], shared: bool = True
) -> dict[int, Callable[[int, Any, Any], Any]]:
    """Hooks for :class:`~carina.security.faults.skynet.SkyNet` (``model.hooks = ...``)."""
    by_layer = {f.layer: f for f in faults}

    def hook(i: int, acc: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
        return apply_flips(acc, by_layer[i], seed=seed, image_ids=image_ids, shared=shared)

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
