"""The batched engine equals the plain reference loop bit for bit (and float64, and CUDA); the draw hash."""

from __future__ import annotations

import pytest
import torch

from carina.security.faults.campaign import Dtype, SweepConfig, SweepResult, run_reference, run_sweep
from carina.security.faults.inject import ONE, apply_flip_rows, flip_masks, mix32, thresholds
from carina.security.faults.metrics import summarize

# A 2 ms window at the end of the frame (dw6.pw, pw7): cheap, yet with random and
# certain bits. 0.85 V is safe (skipped), 0.53/0.52 V draw flips, 0.30 V fails every bit
# with certainty (one seed stands for all); batch 5 mixes points and seeds in one pass.
CFG = dict(voltages=[0.85, 0.53, 0.52, 0.30], freqs_mhz=[200.0], windows=["local:2@38"],
           intensities=[1.0, 2.0], seeds=2, batch=5)  # fmt: skip


def _key(res: SweepResult) -> str:
    # repr: NaN rates (no clean frame) compare equal
    return repr([(p.voltage, p.intensity, p.skipped, p.ious, p.detected, p.flagged_ok) for p in res.points])


@pytest.fixture(scope="module")
def batched(stages, images) -> SweepResult:
    return run_sweep(stages, images, SweepConfig(**CFG))


def test_batched_equals_reference_loop_bitwise(stages, images, batched) -> None:
    ref = run_reference(stages, images, SweepConfig(**CFG))
    assert _key(batched) == _key(ref)
    losses = [summarize(p.ious).loss for p in batched.points]
    assert losses[:2] == [0.0, 0.0] and max(losses) > 0.5  # the sweep is not trivially equal
    assert batched.forwards < ref.forwards and batched.passes < ref.passes  # dedup + seed collapse


def test_float32_fixed_point_is_exact(stages, images, batched) -> None:
    # The emulation sums in float32 only where that is provably exact: float64 gives the same bits.
    wide = run_sweep(stages, images, SweepConfig(**{**CFG, "batch": 16}, dtype=Dtype.FLOAT64))
    assert _key(wide) == _key(batched)


@pytest.mark.gpu
def test_cuda_equals_cpu_bitwise(stages, images, batched) -> None:
    cuda = run_sweep(stages, images, SweepConfig(**CFG, device="cuda"))
    assert _key(cuda) == _key(batched)


def _mix32_py(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & m
    x ^= x >> 12
    x = (x * 0x297A2D39) & m
    return x ^ (x >> 15)


def test_draw_hash_and_thresholds() -> None:
    xs = [0, 1, 2, 12345, 0xFFFFFFFF, 0x80000000]
    assert mix32(torch.tensor(xs)).tolist() == [_mix32_py(x) for x in xs]
    assert thresholds([0.0, 1e-12, 0.25, 1.0]) == (0, 0, ONE // 4, ONE)
    # rates follow the thresholds; certain and impossible bits need no draws
    m = flip_masks(200_000, 3, [thresholds([0.25, 1.0, 0.0])], [(0, 0)], "cpu")
    assert m is not None
    rate = ((m & 1) != 0).double().mean().item()
    assert abs(rate - 0.25) < 0.005
    assert ((m & 2) != 0).all() and not ((m & 4) != 0).any()


@pytest.mark.parametrize("shared", [True, False])
def test_shared_or_independent_draws(shared: bool) -> None:
    thr = [thresholds([0.0] * 9 + [0.2, 0.4, 0.6])]
    m = flip_masks(100_000, 5, thr, [(1, 2)], "cpu", shared=shared)
    assert m is not None
    bit = [((m >> b) & 1).bool() for b in (9, 10, 11)]
    rates = [x.double().mean().item() for x in bit]
    assert all(abs(r - p) < 0.01 for r, p in zip(rates, (0.2, 0.4, 0.6), strict=True))
    nested = bool((~bit[0] | bit[1]).all() and (~bit[1] | bit[2]).all())  # bit 9 fails -> 10, 11 fail
    assert nested is shared


def test_rows_are_independent_of_their_batch() -> None:
    acc = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)).div(4)
    thr = [thresholds([0.0] * 9 + [0.1, 0.3, 0.5]), thresholds([0.0] * 12), thresholds([0.0] * 11 + [1.0])]
    rows = [(0, 7), (1, 8), (2, 9)]
    together = apply_flip_rows(acc, 4, 0.5, thr, rows)
    for r in range(3):
        alone = apply_flip_rows(acc[r : r + 1], 4, 0.5, thr[r : r + 1], rows[r : r + 1])
        assert torch.equal(alone[0], together[r])
    assert torch.equal(together[1], acc[1])  # zero thresholds: untouched
    assert not torch.equal(together[0, :2500], acc[0, :2500]) and torch.equal(together[0, 2500:], acc[0, 2500:])


def test_table_masks_equal_one_comparison_per_bit(monkeypatch) -> None:
    # The searchsorted table lookup gives the masks of the plain rule "bit b flips where draw < t_b".
    from carina.security.faults import inject
    from carina.security.faults.inject import draw_key

    thr = [(0, ONE, 5 << 28, 5 << 28, 1 << 30, 3, ONE - 1, 0, 7 << 29, 1 << 31, 0, ONE),
           (0,) * 11 + (ONE,), (9 << 27,) * 12, (0,) * 12]  # fmt: skip
    rows = [(0, 1), (1, 1), (2, 3), (0, 4)]
    n, layer = 4099, 6
    got = flip_masks(n, layer, thr, rows, "cpu")
    assert got is not None
    base = mix32(torch.arange(n, dtype=torch.int64))
    for r, (ts, (s, i)) in enumerate(zip(thr, rows, strict=True)):
        draw = mix32(base ^ draw_key(s, i, layer, -1))
        want = sum(((draw < t).to(torch.int32) << b) for b, t in enumerate(ts))
        assert torch.equal(got[r], want)
    # applied in blocks of columns (as on the CPU) or all at once: the same bits
    acc = torch.randn(4, n, generator=torch.Generator().manual_seed(1)).div(3)
    whole = apply_flip_rows(acc, layer, 0.8, thr, rows)
    monkeypatch.setattr(inject, "_BLOCK", 4 * 97)
    assert torch.equal(apply_flip_rows(acc, layer, 0.8, thr, rows), whole)
    assert not torch.equal(whole, acc)


def test_blocked_float32_sums_equal_float64(stages) -> None:
    # dw6.pw (1280 inputs) and its ABFT checksum sum in float32 channel blocks: exact, as in float64.
    from carina.security.faults.fixedpoint import FEATURE, WEIGHT
    from carina.security.faults.skynet import blocked_matmul, conv, exact_blocks

    w = WEIGHT.quantize(stages[11].weight)
    x = FEATURE.quantize(torch.rand(2, 1280, 4, 5, generator=torch.Generator().manual_seed(2)) * 12 - 6)
    x[:, :, 0, 0] = FEATURE.min  # the bound's worst case in one position
    for wt in (w, w.sum(0, keepdim=True)):
        blocks = exact_blocks(wt)
        assert blocks is not None and len(blocks) > 1 and blocks[-1][1] == 1280
        assert torch.equal(blocked_matmul(x.float(), wt.float(), blocks).double(), conv(x.double(), wt.double()))
    assert exact_blocks(w[:, :1] * 2**20) is None  # one channel alone over the bound
