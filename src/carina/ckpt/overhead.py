"""The training overhead of checkpointing every K steps, estimated from interleaved blocks.

Comparing a window with saves against a separate clean window cannot resolve an
overhead of a few percent on a machine whose identical clean windows differ by
more than that. This estimate interleaves blocks of the same length in one run:
``clean_0, ckpt_1, clean_1, ckpt_2, ..., ckpt_n, clean_n``. A checkpointed block
starts with one save (its blocking time counts) and runs K steps, longer while
the save is still in flight (so no clean block sees it); every checkpointed block
is compared with the two clean blocks around it, which cancels a drift of the
step time that is linear over the three blocks.

Per checkpointed block ``i`` with ``n_i`` steps taking ``T_i`` in all (blocking
included) and ``base_i`` the mean step of the clean blocks before and after it:

    overhead_i = (T_i - n_i * base_i) / (K * base_i)

the time one save costs, as a fraction of a K-step interval. The estimate is the
mean over blocks, with a two-sided Student-t interval on the n paired values and
a percentile bootstrap interval (seeded, so a record's numbers can be recomputed
from its own step times). :func:`verdict` says whether a goal ``overhead <= g``
is met (the interval's upper end is at most g), missed (its lower end is above
g) or unresolved. A null estimate, each inner clean block against its two
neighbours, shows the noise floor of the same estimator on blocks without saves.

    est = paired_overhead(ckpt_blocks, clean_blocks, interval=64)
    est.pct, est.ci_pct, verdict(est.ci_pct, goal_pct=3.5)
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from carina.core.errors import ConfigError

__all__ = ["Block", "OverheadEstimate", "null_overhead", "paired_overhead", "t_quantile", "verdict"]

#: Two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1..30 (beyond: the normal's 1.96).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip


@dataclass(kw_only=True)
class Block:
    """One block of consecutive training steps.

    Attributes:
        steps_s: Wall time of each step, in order.
        blocking_s: Time inside the save call that opened the block (0 for a clean block).
        in_flight: How many of the first steps ran while the save was not yet durable.
    """

    steps_s: list[float]
    blocking_s: float = 0.0
    in_flight: int = 0

    def __post_init__(self) -> None:
        if not self.steps_s:
            raise ConfigError("a block needs at least one step", key="steps_s")
        if any(not math.isfinite(s) or s < 0 for s in self.steps_s):
            raise ConfigError("step times must be finite and >= 0", key="steps_s")
        if self.blocking_s < 0 or not 0 <= self.in_flight <= len(self.steps_s):
            raise ConfigError("blocking_s must be >= 0 and in_flight within the block", key="in_flight")

    @property
    def total_s(self) -> float:
        """Blocking time plus every step."""
        return self.blocking_s + math.fsum(self.steps_s)

    @property
    def mean_step_s(self) -> float:
        """Mean step time."""
        return math.fsum(self.steps_s) / len(self.steps_s)


@dataclass(kw_only=True)
class OverheadEstimate:
    """A paired overhead estimate, in percent of a K-step interval.

    Attributes:
        pct: Mean of the per-block overheads.
        ci_pct: Two-sided 95 % Student-t interval on the paired values.
        bootstrap_pct: 95 % percentile bootstrap interval of the mean (seeded).
        per_block_pct: Each checkpointed block's overhead, in order.
        in_flight_pct: Mean over blocks of blocking + the in-flight steps' excess over the base,
            per K-step interval (what the save's own steps cost; less noisy, but it assumes the steps
            after the save was durable cost nothing, which ``after_pct`` checks).
        in_flight_ci_pct: Its Student-t interval.
        after_pct: Mean excess of the steps after the save was durable (0 if saves leave no trace).
        blocking_pct: Mean blocking time per K-step interval (the part of ``in_flight_pct`` outside the steps).
        in_flight_step_pct: Mean over blocks of how much slower than the base an in-flight step ran, in
            percent of a step (blocks with no in-flight step left out): the writer's interference per step.
        after_step_pct: The same for the steps after the save was durable: what an in-flight step should
            be compared with, since both are measured against the same clean neighbours.
        flight_minus_after_step_pct: Mean over blocks with both kinds of steps of the in-flight step's
            excess minus the after-durable step's (what the running save adds to a step beyond the block's
            own level), with its Student-t interval in ``flight_minus_after_ci_pct`` ((0, 0) below 2 blocks).
        interval: K.
        base_step_s: Mean clean step over all clean blocks.
    """

    pct: float
    ci_pct: tuple[float, float]
    bootstrap_pct: tuple[float, float]
    per_block_pct: list[float]
    in_flight_pct: float
    after_pct: float
    in_flight_ci_pct: tuple[float, float] = (0.0, 0.0)
    blocking_pct: float = 0.0
    in_flight_step_pct: float = 0.0
    after_step_pct: float = 0.0
    flight_minus_after_step_pct: float = 0.0
    flight_minus_after_ci_pct: tuple[float, float] = (0.0, 0.0)
    interval: int
    base_step_s: float

    @property
    def n(self) -> int:
        """How many checkpointed blocks."""
        return len(self.per_block_pct)


def t_quantile(df: int) -> float:
    """The two-sided 95 % Student-t quantile for ``df`` degrees of freedom."""
    if df < 1:
        raise ConfigError("a t interval needs at least 2 paired values", key="df")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def _interval(values: Sequence[float], resamples: int, seed: int) -> tuple[tuple[float, float], tuple[float, float]]:
    mean = statistics.fmean(values)
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    if not resamples:
        return (mean - half, mean + half), (mean, mean)
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    lo, hi = means[int(0.025 * (resamples - 1))], means[math.ceil(0.975 * (resamples - 1))]
    return (mean - half, mean + half), (lo, hi)


def _base(before: Block, after: Block) -> float:
    """Mean step of two clean blocks together."""
    return (math.fsum(before.steps_s) + math.fsum(after.steps_s)) / (len(before.steps_s) + len(after.steps_s))


def _excess_pct(seconds: float, steps: int, base: float, interval: int) -> float:
    return 100 * (seconds - steps * base) / (interval * base)


def _estimate(per: list[float], clean: Sequence[Block], interval: int, resamples: int, seed: int,
              flight: float, after: float) -> OverheadEstimate:  # fmt: skip
    ci, boot = _interval(per, resamples, seed)
    base_all = math.fsum(math.fsum(b.steps_s) for b in clean) / sum(len(b.steps_s) for b in clean)
    return OverheadEstimate(pct=statistics.fmean(per), ci_pct=ci, bootstrap_pct=boot, per_block_pct=per,
                            in_flight_pct=flight, after_pct=after, interval=interval, base_step_s=base_all)  # fmt: skip


def paired_overhead(
    ckpt: Sequence[Block], clean: Sequence[Block], interval: int, *, resamples: int = 4000, seed: int = 0
) -> OverheadEstimate:
    """The overhead of ``ckpt[i]`` against ``clean[i]`` (before it) and ``clean[i + 1]`` (after it).

    Args:
        ckpt: The checkpointed blocks, n >= 2, in the order they ran.
        clean: The clean blocks, n + 1: one before the first checkpointed block and one after each.
        interval: K, the steps between saves that a checkpointed block stands for.
        resamples: Bootstrap resamples.
        seed: The bootstrap's seed.

    Raises:
        ConfigError: Fewer than two checkpointed blocks, a clean count other than n + 1, K < 1.
    """
    if len(ckpt) < 2:
        raise ConfigError(f"need >= 2 checkpointed blocks for an interval, got {len(ckpt)}", key="ckpt")
    if len(clean) != len(ckpt) + 1:
        raise ConfigError(f"need {len(ckpt) + 1} clean blocks around {len(ckpt)} checkpointed ones, got "
                          f"{len(clean)}", key="clean")  # fmt: skip
    if interval < 1:
        raise ConfigError("interval must be >= 1 step", key="interval")
    per, flight, after, blocking = [], [], [], []
    per_step: tuple[list[float], list[float]] = ([], [])
    diffs = []
    for i, blk in enumerate(ckpt):
        base = _base(clean[i], clean[i + 1])
        per.append(_excess_pct(blk.total_s, len(blk.steps_s), base, interval))
        head, tail = blk.steps_s[: blk.in_flight], blk.steps_s[blk.in_flight :]
        flight.append(_excess_pct(blk.blocking_s + math.fsum(head), len(head), base, interval))
        after.append(_excess_pct(math.fsum(tail), len(tail), base, interval))
        blocking.append(100 * blk.blocking_s / (interval * base))
        for steps, out in zip((head, tail), per_step, strict=True):
            if steps:
                out.append(_excess_pct(math.fsum(steps), len(steps), base, len(steps)))
        if head and tail:
            diffs.append(per_step[0][-1] - per_step[1][-1])
    est = _estimate(per, clean, interval, resamples, seed, statistics.fmean(flight), statistics.fmean(after))
    est.in_flight_ci_pct = _interval(flight, 0, seed)[0]
    est.blocking_pct = statistics.fmean(blocking)
    est.in_flight_step_pct, est.after_step_pct = (statistics.fmean(v) if v else 0.0 for v in per_step)
    if diffs:
        est.flight_minus_after_step_pct = statistics.fmean(diffs)
    if len(diffs) >= 2:
        est.flight_minus_after_ci_pct = _interval(diffs, 0, seed)[0]
    return est


def null_overhead(clean: Sequence[Block], interval: int, *, resamples: int = 4000, seed: int = 0) -> OverheadEstimate:
    """The same estimate with each inner clean block posing as checkpointed (true value 0): the noise floor.

    ``clean[i]`` for ``0 < i < len - 1`` is compared with ``clean[i - 1]`` and ``clean[i + 1]``.

    Raises:
        ConfigError: Fewer than four clean blocks (two inner ones).
    """
    if len(clean) < 4:
        raise ConfigError(f"a null estimate needs >= 4 clean blocks, got {len(clean)}", key="clean")
    per = [_excess_pct(clean[i].total_s, len(clean[i].steps_s), _base(clean[i - 1], clean[i + 1]), interval)
           for i in range(1, len(clean) - 1)]  # fmt: skip
    mean = statistics.fmean(per)
    return _estimate(per, clean, interval, resamples, seed, 0.0, mean)


def verdict(ci_pct: tuple[float, float], goal_pct: float, applies: bool = True) -> str:
    """``met`` (the interval at or below the goal), ``missed`` (above it), ``unresolved``, or ``n/a``."""
    if not applies:
        return "n/a"
    lo, hi = ci_pct
    if hi <= goal_pct:
        return "met"
    if lo > goal_pct:
        return "missed"
    return "unresolved"
