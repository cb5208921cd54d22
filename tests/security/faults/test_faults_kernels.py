"""The fused CPU kernels give the bits of the torch ops they replace, op by op and for a whole campaign."""

from __future__ import annotations

import pytest
import torch

from carina.security.faults import kernels
from carina.security.faults.campaign import SweepConfig, run_sweep
from carina.security.faults.fixedpoint import ACCUMULATOR, FEATURE, WEIGHT
from carina.security.faults.inject import ONE, _flip_rows_torch, draw_key, thresholds
from carina.security.faults.skynet import _pool2, conv

THR = [(0, ONE, 5 << 28, 5 << 28, 1 << 30, 3, ONE - 1, 0, 7 << 29, 1 << 31, 0, ONE), (0,) * 11 + (ONE,),
       (9 << 27,) * 12, (0,) * 12, thresholds([0.0] * 9 + [1e-3, 1e-2, 0.3])]  # fmt: skip


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (torch.equal calls -0.0 and 0.0 equal)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}
    return a.dtype == b.dtype and torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("quantized", [True, False])
def test_flip_kernel_equals_torch_ops(dtype: torch.dtype, quantized: bool) -> None:
    g = torch.Generator().manual_seed(3)
    m = 3 * kernels._COLS + 123  # several column tasks per row, a ragged last one
    acc = torch.randn(len(THR), m, generator=g, dtype=dtype) * 3
    acc = ACCUMULATOR.quantize(acc) if quantized else acc  # float models flip unquantized values
    rows = [(s, i) for s, i in zip((0, 1, 2, 0, 4), (1, 1, 3, 4, 2), strict=True)]
    for layer, n in ((0, m), (6, round(m * 0.7)), (11, 5)):
        want = _flip_rows_torch(acc, n, layer, THR, rows, ACCUMULATOR, shared=True)
        got = kernels.flip_rows_cpu(acc, n, [draw_key(s, i, layer, -1) for s, i in rows], THR, ACCUMULATOR)
        assert got.dtype == dtype and _same_bits(got, want)
        assert not torch.equal(got, acc) and torch.equal(got[:, n:], acc[:, n:])
        # in place; rounded values: only the flipped outputs are rewritten
        mine = acc.clone()
        keys = [draw_key(s, i, layer, -1) for s, i in rows]
        kernels.flip_rows_cpu(mine, n, keys, THR, ACCUMULATOR, inplace=True, quantized=quantized)
        assert _same_bits(mine, want)


@pytest.mark.parametrize("src", [torch.float32, torch.float64])
def test_quantize_kernel_equals_torch_ops(src: torch.dtype) -> None:
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 5, 7, 9, generator=g, dtype=src) * 6).round(decimals=3)
    x[0, 0, 0, :4] = torch.tensor([0.5 / 256, -0.5 / 256, 100.0, -100.0])  # ties round up; saturation
    b = WEIGHT.quantize(torch.randn(5, generator=g, dtype=torch.float32))
    assert _same_bits(kernels.quantize_cpu(x, ACCUMULATOR, torch.float32), ACCUMULATOR.quantize(x).float())
    xf = ACCUMULATOR.quantize(x).float()
    want = FEATURE.quantize((xf + b.view(1, -1, 1, 1)).clamp_(0.0, 6.0))
    assert _same_bits(kernels.quantize_cpu(xf, FEATURE, torch.float32, bias=b, relu6=True), want)
    pooled = kernels.quantize_cpu(xf[..., :6, :8], FEATURE, torch.float32, bias=b, relu6=True, pool=True)
    assert _same_bits(pooled, _pool2(want[..., :6, :8].contiguous()))


def test_depthwise_kernel_equals_shifted_multiply_adds() -> None:
    g = torch.Generator().manual_seed(5)
    w = WEIGHT.quantize(torch.randn(6, 1, 3, 3, generator=g) * 3)
    x = FEATURE.quantize(torch.rand(2, 6, 5, 8, generator=g) * 8 - 4)
    x[0, 0] = FEATURE.min  # the bound's worst case on a whole plane
    want = ACCUMULATOR.quantize(conv(x, w))
    assert _same_bits(kernels.depthwise_quantized_cpu(x, w, ACCUMULATOR), want)


def test_campaign_equals_torch_ops(stages, images, monkeypatch) -> None:
    # A global window over every stage (fused depthwise, quantize, flips, detectors), batched rows.
    cfg = SweepConfig(voltages=[0.53, 0.30], freqs_mhz=[200.0], seeds=2, batch=2)
    fused = run_sweep(stages, images[:1], cfg)
    monkeypatch.setattr(kernels, "ENABLED", False)
    plain = run_sweep(stages, images[:1], cfg)
    key = lambda r: repr([(p.ious, p.detected, p.flagged_ok) for p in r.points])  # noqa: E731
    assert key(fused) == key(plain)
    assert len({tuple(p.ious) for p in fused.points}) > 1  # the points differ: not trivially equal
