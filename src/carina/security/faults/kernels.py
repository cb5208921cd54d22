"""Fused CPU kernels (numba) of the fixed-point emulation and the flips: the same bits as the torch ops.

On the CPU a campaign's time went into element-wise torch passes, a dozen per output for
the flips alone (draw hash, threshold lookup, rounding to codes, the sign-extended XOR,
the add), each through fresh memory. Each kernel here does one pass, element by element
in registers, in parallel over rows and channels or column blocks:

* :func:`flip_rows_cpu`: the flips of
  :func:`~carina.security.faults.inject.apply_flip_rows` (shared draws): the same integer
  hash (:func:`~carina.security.faults.inject.mix32` as uint32 arithmetic modulo 2**32),
  the plain rule "bit b flips where draw < t_b" (which the table lookup equals, tested),
  the same float operations in the same order (``v * 2**F + 0.5``, floor, clamp;
  ``v + delta * step``);
* :func:`quantize_cpu`: an accumulator's round-and-saturate, or a stage's ``+ bias``,
  ReLU6 and feature rounding, as :class:`~carina.security.faults.skynet.SkyNet` does them;
* :func:`depthwise_quantized_cpu`: the 3x3 depthwise convolution with the accumulator's
  rounding; its sums are exact (fixed-point codes), so any order gives the same bits.

numba contracts no multiply-add unless ``fastmath`` is set (it is not), and the
multiplies by ``2**F`` and ``step`` are exact anyway. ``tests/security/faults/test_faults_kernels.py``
checks each kernel against the torch ops and a whole campaign with the kernels off
(:data:`ENABLED`). CUDA tensors always take the torch ops.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from carina.security.faults.fixedpoint import FixedType

__all__ = ["ENABLED", "applies", "depthwise_quantized_cpu", "flip_rows_cpu", "keep_freed_memory", "quantize_cpu"]

_COLS = 1 << 15  # columns of one parallel task
_SUB = 1 << 10  # columns whose draws are hashed at once
_BASE: dict[str, Any] = {}  # mix32(arange(m)) as uint32, per dtype's kernel

#: Use the kernels where they apply (CPU tensors without autograd); tests switch this off to
#: compare a whole campaign with the plain torch ops.
ENABLED = True


def applies(x: torch.Tensor) -> bool:
    """Whether the kernels handle ``x``: enabled, a float32/float64 CPU tensor, no autograd."""
    import torch

    return ENABLED and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad


@functools.lru_cache(maxsize=1 << 12)
def threshold_table(thr: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A row's sorted random thresholds (0 < t < 2**32), and its mask for each count of them at or below a draw.

    With idx = #{j: s_j <= draw} and L_b = #{j: s_j < t_b}, draw < t_b <=> idx <= L_b: the
    mask of a draw is ``table[idx]``, the same as one comparison per bit (tested).
    """
    one = 1 << 32
    bounds = tuple(sorted(t for t in thr if 0 < t < one))
    certain = sum(1 << b for b, t in enumerate(thr) if t == one)
    below = {b: sum(1 for s in bounds if s < t) for b, t in enumerate(thr) if 0 < t < one}  # L_b
    table = tuple(certain | sum(1 << b for b, lb in below.items() if c <= lb) for c in range(len(bounds) + 1))
    return bounds, table


@functools.cache
def _kernel(dtype: str) -> Any:
    """Compile the flip kernel for ``dtype`` (float32/float64) values."""
    import numba
    import numpy as np

    u, i32, ft = np.uint32, np.int32, getattr(np, dtype)
    c1, c2, s15, s12 = u(0x2C1B3C6D), u(0x297A2D39), u(15), u(12)
    half_f = ft(0.5)

    @numba.njit(inline="always")
    def mix(x: Any) -> Any:  # pragma: no cover - compiled; mix32 as uint32 arithmetic
        x = u(x ^ (x >> s15))
        x = u(x * c1)
        x = u(x ^ (x >> s12))
        x = u(x * c2)
        return u(x ^ (x >> s15))

    @numba.njit(parallel=True, nogil=True)
    def base(m):  # type: ignore[no-untyped-def]  # pragma: no cover
        out = np.empty(m, dtype=u)
        for j in numba.prange(m):
            out[j] = mix(u(j))
        return out

    @numba.njit(inline="always")
    def _flip1(v, msk, scale, qmin, qmax, wmask, half, step):  # type: ignore[no-untyped-def]  # pragma: no cover
        code = i32(min(max(np.floor(v * scale + half_f), qmin), qmax))
        # flipped code minus code, sign-extended from the low bits
        delta = i32(i32(i32(i32(code ^ msk) + half) & wmask) - half - code)
        return v + ft(delta) * step

    @numba.njit(parallel=True, nogil=True)
    def flip(src, out, n, bj, keys, bounds, nbounds, tables, scale, qmin, qmax, wmask, half, step, same, keep):  # type: ignore[no-untyped-def]  # pragma: no cover
        # bj[j] = mix32(j); same: out is src; keep: outputs without a flip are left as they are
        # (the same bits when src holds no -0.0)
        rows, m = src.shape
        blocks = (m + _COLS - 1) // _COLS
        for task in numba.prange(rows * blocks):
            r, lo = task // blocks, (task % blocks) * _COLS
            hi = min(m, lo + _COLS)
            key, k = keys[r], nbounds[r]
            top = bounds[r, k - 1] if k else u(0)  # a draw at or above every bound: mask tables[r, k]
            sparse = keep and tables[r, k] == 0  # no certain bit: few outputs flip, rewrite only those
            draw = np.empty(_SUB, dtype=u)
            idx = np.zeros(_SUB, dtype=i32)
            for sub in range(lo, min(hi, n) if k or not sparse else lo, _SUB):
                size = min(sub + _SUB, hi, n) - sub
                for t in range(size if k else 0):  # branch-free loops: vectorized
                    draw[t] = mix(bj[sub + t] ^ key)
                if sparse:
                    for t in range(size):
                        if draw[t] < top:
                            c = 0
                            while bounds[r, c] <= draw[t]:  # sorted; bounds[r, k - 1] > the draw ends it
                                c += 1
                            if tables[r, c]:
                                out[r, sub + t] = _flip1(
                                    src[r, sub + t], tables[r, c], scale, qmin, qmax, wmask, half, step
                                )
                    continue
                idx[:size] = 0
                for b in range(k):  # idx = how many sorted bounds are at or below the draw
                    bound = bounds[r, b]
                    for t in range(size):
                        idx[t] += i32(bound <= draw[t])
                for t in range(size):
                    out[r, sub + t] = _flip1(src[r, sub + t], tables[r, idx[t]], scale, qmin, qmax, wmask, half, step)
            if not same:
                for j in range(max(lo, n), hi):
                    out[r, j] = src[r, j]

    return base, flip


def flip_rows_cpu(
    flat: torch.Tensor, n: int, keys: list[int], thr: list[tuple[int, ...]], fmt: FixedType, *, inplace: bool = False,
    quantized: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``flat`` (B, m) with the first ``n`` outputs of each row flipped (into ``flat`` itself when ``inplace``).

    Args:
        flat: Accumulator values, float32 or float64, on the CPU.
        n: Exposed outputs per row.
        keys: Per row, the draw key (:func:`~carina.security.faults.inject.draw_key` with bit -1).
        thr: Per row, the bit thresholds (0 never, ``2**32`` always flips).
        fmt: The accumulator type whose two's-complement codes flip.
        inplace: Write into ``flat`` (contiguous) rather than a new tensor.
        quantized: ``flat`` holds ``fmt`` values (rounded: no -0.0), so in place an output
            without a flip is not even rewritten (``v + 0.0`` would only turn -0.0 into 0.0).
    """
    import numpy as np
    import torch

    src = flat.contiguous()
    out = src if inplace else torch.empty_like(src)
    same = out is src
    bounds, tables = zip(*(threshold_table(tuple(ts)) for ts in thr), strict=True)
    k = max(1, *(len(b) for b in bounds))
    bnd = np.zeros((len(thr), k), dtype=np.uint32)
    tab = np.zeros((len(thr), k + 1), dtype=np.int32)
    for r, (b, t) in enumerate(zip(bounds, tables, strict=True)):
        bnd[r, : len(b)], tab[r, : len(t)] = b, t
    ft, i32 = src.numpy().dtype.type, np.int32
    base, flip = _kernel(ft.__name__)
    if ft.__name__ not in _BASE or len(_BASE[ft.__name__]) < n:
        _BASE[ft.__name__] = base(max(n, 1 << 16))
    flip(
        src.numpy(), out.numpy(), n, _BASE[ft.__name__], np.array(keys, dtype=np.uint32), bnd,
        np.array([len(b) for b in bounds]),
        tab, ft(1 << fmt.frac_bits), ft(fmt.qmin), ft(fmt.qmax), i32((1 << fmt.bits) - 1), i32(1 << (fmt.bits - 1)),
        ft(fmt.step), same, same and quantized,
    )  # fmt: skip
    return out


@functools.cache
def _quant_kernel(src: str, dst: str, bias: bool, relu6: bool, pool: bool) -> Any:
    """Compile the (bias, ReLU6,) round-and-saturate (, 2x2 max pool) kernel from ``src`` to ``dst`` values."""
    import numba
    import numpy as np

    ft, ot = getattr(np, src), getattr(np, dst)
    half, zero, six = ft(0.5), ft(0.0), ft(6.0)

    @numba.njit(inline="always")
    def one(v, bc, scale, qmin, qmax, step):  # type: ignore[no-untyped-def]  # pragma: no cover
        if bias:
            v = v + bc
        if relu6:
            v = min(max(v, zero), six)
        return ot(min(max(np.floor(v * scale + half), qmin), qmax) * step)

    @numba.njit(parallel=True, nogil=True)
    def quant(x, out, b, scale, qmin, qmax, step):  # type: ignore[no-untyped-def]  # pragma: no cover
        rows, chans, h, w = x.shape
        for task in numba.prange(rows * chans):
            r, c = task // chans, task % chans
            bc = b[c]
            if not pool:
                for y in range(h):
                    for j in range(w):
                        out[r, c, y, j] = one(x[r, c, y, j], bc, scale, qmin, qmax, step)
                continue
            for y in range(h // 2):  # the max of the rounded values: the same as rounding, then pooling
                for j in range(w // 2):
                    a = max(
                        one(x[r, c, 2 * y, 2 * j], bc, scale, qmin, qmax, step),
                        one(x[r, c, 2 * y, 2 * j + 1], bc, scale, qmin, qmax, step),
                    )
                    d = max(
                        one(x[r, c, 2 * y + 1, 2 * j], bc, scale, qmin, qmax, step),
                        one(x[r, c, 2 * y + 1, 2 * j + 1], bc, scale, qmin, qmax, step),
                    )
                    out[r, c, y, j] = max(a, d)

    return quant


def quantize_cpu(
    x: torch.Tensor, fmt: FixedType, dtype: torch.dtype, *, bias: torch.Tensor | None = None, relu6: bool = False,
    inplace: bool = False, pool: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``fmt.quantize`` of ``x`` (B, C, H, W) (after ``+ bias[c]`` and ReLU6 when asked), as ``dtype``.

    The same bits as the torch ops ``(x + bias.view(1, -1, 1, 1)).clamp_(0, 6)``, then
    :meth:`~carina.security.faults.fixedpoint.FixedType.quantize`, then ``.to(dtype)`` (then
    a 2x2 max pool, stride 2, when ``pool``). A new tensor, or ``x`` itself when ``inplace``
    and ``x`` is contiguous and of ``dtype`` and not pooled (fresh pages cost more than the pass).
    """
    import torch

    src = x.contiguous()
    b, c, h, w = src.shape
    if pool:
        out = torch.empty((b, c, h // 2, w // 2), dtype=dtype)
    else:
        out = src if inplace and src is x and x.dtype == dtype else torch.empty(src.shape, dtype=dtype)
    ft = src.numpy().dtype.type
    bv = (bias.to(src.dtype) if bias is not None else torch.zeros(c, dtype=src.dtype)).contiguous().numpy()
    kern = _quant_kernel(ft.__name__, out.numpy().dtype.name, bias is not None, relu6, pool)
    kern(src.numpy(), out.numpy(), bv, ft(1 << fmt.frac_bits), ft(fmt.qmin), ft(fmt.qmax), ft(fmt.step))
    return out


@functools.cache
def _dw_kernel(dtype: str) -> Any:
    """Compile the 3x3 depthwise convolution (padding 1) fused with the accumulator's round-and-saturate."""
    import numba
    import numpy as np

    ft = getattr(np, dtype)
    half, zero = ft(0.5), ft(0.0)

    @numba.njit(parallel=True, nogil=True)
    def dw(x, k, out, scale, qmin, qmax, step):  # type: ignore[no-untyped-def]  # pragma: no cover
        rows, chans, h, w = x.shape
        for task in numba.prange(rows * chans):
            r, c = task // chans, task % chans
            acc = np.empty(w, dtype=ft)
            for y in range(h):
                acc[:] = zero
                for dy in range(3):  # branch-free row loops (vectorized); exact sums, so any order
                    yy = y + dy - 1
                    if 0 <= yy < h:
                        row, k0, k1, k2 = x[r, c, yy], k[c, 3 * dy], k[c, 3 * dy + 1], k[c, 3 * dy + 2]
                        for xo in range(w):
                            acc[xo] += row[xo] * k1
                        for xo in range(1, w):
                            acc[xo] += row[xo - 1] * k0
                        for xo in range(w - 1):
                            acc[xo] += row[xo + 1] * k2
                for xo in range(w):
                    out[r, c, y, xo] = min(max(np.floor(acc[xo] * scale + half), qmin), qmax) * step

    return dw


def depthwise_quantized_cpu(x: torch.Tensor, w: torch.Tensor, fmt: FixedType) -> torch.Tensor:
    """``fmt.quantize(conv(x, w))`` for a 3x3 depthwise ``w`` (C, 1, 3, 3), padding 1: a new tensor.

    Only for exact sums (fixed-point codes whose partial sums stay below 2**24 steps in
    float32, which a 3x3 depthwise of 9-bit features and 11-bit weights always does):
    then any order of the nine products gives the bits of
    :func:`~carina.security.faults.skynet.conv`'s nine shifted multiply-adds.
    """
    import torch

    src = x.contiguous()
    out = torch.empty_like(src)
    ft = src.numpy().dtype.type
    k = w.to(src.dtype).reshape(w.shape[0], 9).contiguous().numpy()
    _dw_kernel(ft.__name__)(src.numpy(), k, out.numpy(), ft(1 << fmt.frac_bits), ft(fmt.qmin), ft(fmt.qmax),
                            ft(fmt.step))  # fmt: skip
    return out


@functools.cache
def keep_freed_memory() -> bool:
    """Serve allocations up to 32 MiB from glibc's heap and keep freed memory there (once; True if set).

    A campaign allocates the same activations pass after pass; allocations above glibc's
    mmap threshold come from fresh pages, whose faults and zeroing cost more than the
    element-wise pass that fills them. This raises the threshold to its maximum (32 MiB)
    and stops trimming the heap, process-wide; results do not change. No-op off glibc.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
