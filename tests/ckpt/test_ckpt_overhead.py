"""carina.ckpt.overhead: the interleaved-block overhead estimate, on step times with known answers."""

from __future__ import annotations

import random

import pytest

from carina.ckpt.overhead import Block, null_overhead, paired_overhead, t_quantile, verdict
from carina.core.errors import ConfigError


def _clean(steps: list[float]) -> Block:
    return Block(steps_s=steps)


def test_constant_steps_give_the_exact_excess() -> None:
    k = 4
    clean = [_clean([1.0] * k) for _ in range(4)]
    ckpt = [Block(steps_s=[1.3, 1.0, 1.0, 1.0], blocking_s=0.2, in_flight=1) for _ in range(3)]
    est = paired_overhead(ckpt, clean, k)
    assert est.pct == pytest.approx(12.5)  # (0.2 + 0.3) / (4 x 1.0)
    assert est.ci_pct == pytest.approx((12.5, 12.5))
    assert est.bootstrap_pct == pytest.approx((12.5, 12.5))
    assert est.in_flight_pct == pytest.approx(12.5)
    assert est.in_flight_ci_pct == pytest.approx((12.5, 12.5))
    assert est.after_pct == pytest.approx(0.0)
    assert est.blocking_pct == pytest.approx(5.0)  # 0.2 / (4 x 1.0)
    assert est.in_flight_step_pct == pytest.approx(30.0) and est.after_step_pct == pytest.approx(0.0)
    assert est.n == 3 and est.base_step_s == pytest.approx(1.0)
    assert verdict(est.ci_pct, 3.5) == "missed"
    assert verdict(est.ci_pct, 15.0) == "met"
    assert verdict(est.ci_pct, 3.5, applies=False) == "n/a"


def test_linear_drift_cancels_where_separate_windows_do_not() -> None:
    """Step time rising linearly over the run: bracketing recovers the true excess exactly."""
    k, n, excess = 10, 5, 0.4
    seq = iter(range(10**6))

    def steps() -> list[float]:
        return [1.0 + 0.002 * next(seq) for _ in range(k)]

    clean, ckpt = [_clean(steps())], []
    for _ in range(n):
        s = steps()
        s[0] += excess
        ckpt.append(Block(steps_s=s, in_flight=1))
        clean.append(_clean(steps()))
    est = paired_overhead(ckpt, clean, k)
    for blk, pct, before, after in zip(ckpt, est.per_block_pct, clean, clean[1:], strict=False):
        base = (sum(before.steps_s) + sum(after.steps_s)) / (2 * k)
        assert pct == pytest.approx(100 * excess / (k * base), rel=1e-9)
        assert sum(blk.steps_s) - excess == pytest.approx(k * base, rel=1e-12)  # the bracket is the true base
    first = clean[0].mean_step_s  # what comparing with one separate clean window would say
    naive = 100 * (sum(b.total_s for b in ckpt) / (n * k) - first) / first
    assert naive > 3 * est.pct  # drift alone would read as ~4x the true overhead


def test_extended_block_counts_only_the_excess() -> None:
    """A save still in flight after K steps: the block runs on, the extra steps are not overhead."""
    k = 5
    clean = [_clean([2.0] * k) for _ in range(3)]
    ckpt = [Block(steps_s=[2.0] * (k + 3), blocking_s=0.5, in_flight=k + 2) for _ in range(2)]
    est = paired_overhead(ckpt, clean, k)
    assert est.pct == pytest.approx(100 * 0.5 / (k * 2.0))
    assert est.in_flight_pct + est.after_pct == pytest.approx(est.pct)


def test_noisy_steps_interval_covers_truth_and_null_covers_zero() -> None:
    rng = random.Random(1)
    k, n, true_pct = 40, 30, 2.0

    def steps() -> list[float]:
        return [0.1 * (1 + rng.gauss(0, 0.05)) for _ in range(k)]

    clean, ckpt = [_clean(steps())], []
    for _ in range(n):
        ckpt.append(Block(steps_s=steps(), blocking_s=true_pct / 100 * k * 0.1, in_flight=3))
        clean.append(_clean(steps()))
    est = paired_overhead(ckpt, clean, k)
    lo, hi = est.ci_pct
    assert lo < true_pct < hi
    assert hi - lo < 2.0
    blo, bhi = est.bootstrap_pct
    assert blo < est.pct < bhi
    assert verdict(est.ci_pct, 3.5) in ("met", "unresolved")
    null = null_overhead(clean, k)
    assert null.n == n - 1
    assert null.ci_pct[0] < 0 < null.ci_pct[1]
    assert paired_overhead(ckpt, clean, k).bootstrap_pct == est.bootstrap_pct  # seeded: recomputable


def test_unresolved_when_the_interval_straddles_the_goal() -> None:
    clean = [_clean([1.0] * 10) for _ in range(4)]
    ckpt = [Block(steps_s=[1.0] * 10, blocking_s=b) for b in (0.0, 0.7, 0.35)]  # 0 %, 7 %, 3.5 %
    est = paired_overhead(ckpt, clean, 10)
    assert est.pct == pytest.approx(3.5)
    assert verdict(est.ci_pct, 3.5) == "unresolved"


@pytest.mark.parametrize(
    ("ckpt", "clean", "k", "what"),
    [
        (1, 2, 5, "need >= 2 checkpointed"),
        (2, 2, 5, "need 3 clean blocks"),
        (2, 3, 0, "interval must be"),
    ],
)
def test_bad_shapes_are_named(ckpt: int, clean: int, k: int, what: str) -> None:
    with pytest.raises(ConfigError, match=what):
        paired_overhead([Block(steps_s=[1.0])] * ckpt, [Block(steps_s=[1.0])] * clean, k)


def test_bad_blocks_are_named() -> None:
    with pytest.raises(ConfigError, match="at least one step"):
        Block(steps_s=[])
    with pytest.raises(ConfigError, match="finite"):
        Block(steps_s=[1.0, float("nan")])
    with pytest.raises(ConfigError, match="in_flight"):
        Block(steps_s=[1.0], in_flight=2)
    with pytest.raises(ConfigError, match="4 clean blocks"):
        null_overhead([Block(steps_s=[1.0])] * 3, 1)
    with pytest.raises(ConfigError, match="2 paired values"):
        t_quantile(0)


def test_t_quantiles_match_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 11, 29, 30):
        assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=6e-4)
    assert t_quantile(200) == pytest.approx(stats.norm.ppf(0.975), abs=1e-3)


def test_a_slowdown_over_the_whole_block_shows_in_both_per_step_rates() -> None:
    """Steps 10 % slow before and after durable: the per-step rates agree, so the writer is not singled out."""
    k = 5
    clean = [_clean([1.0] * k) for _ in range(3)]
    ckpt = [Block(steps_s=[1.1] * k, blocking_s=0.0, in_flight=2) for _ in range(2)]
    est = paired_overhead(ckpt, clean, k)
    assert est.in_flight_step_pct == pytest.approx(10.0) and est.after_step_pct == pytest.approx(10.0)
    assert est.in_flight_pct == pytest.approx(4.0) and est.after_pct == pytest.approx(6.0)
    assert est.blocking_pct == 0.0
    assert est.flight_minus_after_step_pct == pytest.approx(0.0)
    assert est.flight_minus_after_ci_pct == pytest.approx((0.0, 0.0))


def test_a_slower_in_flight_step_shows_as_the_difference() -> None:
    """In-flight steps 20 % and 30 % over, the later ones 0 % and 10 %: the save adds 20 % to its steps."""
    k = 4
    clean = [_clean([1.0] * k) for _ in range(3)]
    ckpt = [Block(steps_s=[1.2, 1.2, 1.0, 1.0], in_flight=2), Block(steps_s=[1.3, 1.3, 1.1, 1.1], in_flight=2)]
    est = paired_overhead(ckpt, clean, k)
    assert est.in_flight_step_pct == pytest.approx(25.0) and est.after_step_pct == pytest.approx(5.0)
    assert est.flight_minus_after_step_pct == pytest.approx(20.0)
    assert est.flight_minus_after_ci_pct == pytest.approx((20.0, 20.0))
