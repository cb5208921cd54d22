"""How to split an optimizer step's tokens into micro-batches: plan every split, take the fastest that fits.

With gradient accumulation a block's gradient is final only after the last micro-batch's
backward, so the CPU optimizer can overlap that one backward and no other: at 32k tokens per
step as 4 micro-batches of 8k on an H200 the CPU's 0.9 s update plus the host adds of the
micro-batches ran after the compute (``offload_s2_7b16l_32k``, session 5: step 2.96 s against an
ideal of 1.64 s). One micro-batch of all 32k tokens overlaps the update with the whole backward
and needs no adds; it costs activation memory, which the planner prices (keep, swap or
recompute per block). Ratel and TERAIO likewise train their large-token configurations
without accumulation. This module plans each split of the step into whole sequences and
recommends the fastest one that fits the budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from carina.core.errors import CapacityError, ConfigError
from carina.offload.planner import Plan

__all__ = ["Split", "best_split", "plan_splits", "split_candidates"]


@dataclass(frozen=True, kw_only=True)
class Split:
    """One way to split a step: its plan, or why it does not fit."""

    micro_batches: int
    tokens: int  # per micro-batch
    plan: Plan | None = None
    reason: str = ""

    @property
    def step_s(self) -> float | None:
        """The predicted step time (None when it does not fit)."""
        return None if self.plan is None else self.plan.time.predicted

    def row(self) -> dict[str, object]:
        """A JSON-ready row."""
        if self.plan is None:
            return {"micro_batches": self.micro_batches, "tokens": self.tokens, "fits": False, "reason": self.reason}
        t = self.plan.time
        return {
            "micro_batches": self.micro_batches,
            "tokens": self.tokens,
            "fits": True,
            "step_s": t.predicted,
            "compute_s": t.compute,
            "cpu_s": t.cpu_optimizer,
            "h2d_s": t.h2d,
            "bottleneck": t.bottleneck,
            "device_peak": self.plan.device_peak,
            "host": self.plan.host_bytes,
        }


def split_candidates(tokens_per_step: int, seq_len: int, max_micro_batches: int = 64) -> list[tuple[int, int]]:
    """``(micro_batches, tokens per micro-batch)`` with whole sequences in every micro-batch, fewest first.

    Raises:
        ConfigError: ``tokens_per_step`` is not a positive multiple of ``seq_len``.
    """
    if seq_len < 1 or tokens_per_step < seq_len or tokens_per_step % seq_len:
        raise ConfigError(
            f"tokens per step ({tokens_per_step}) must be a positive multiple of the sequence length ({seq_len})",
            key="tokens_per_step",
        )
    sequences = tokens_per_step // seq_len
    return [(m, tokens_per_step // m) for m in range(1, min(sequences, max_micro_batches) + 1) if sequences % m == 0]


def plan_splits(
    tokens_per_step: int, seq_len: int, plan_for: Callable[[int, int], Plan], max_micro_batches: int = 64
) -> list[Split]:
    """Plan every split; ``plan_for(tokens_per_micro_batch, micro_batches)`` plans one (or raises CapacityError)."""
    rows = []
    for micro, tokens in split_candidates(tokens_per_step, seq_len, max_micro_batches):
        try:
            rows.append(Split(micro_batches=micro, tokens=tokens, plan=plan_for(tokens, micro)))
        except CapacityError as exc:
            rows.append(Split(micro_batches=micro, tokens=tokens, reason=str(exc)))
    return rows


def best_split(rows: list[Split]) -> Split:
    """The fastest split that fits (fewer micro-batches on a tie).

    Raises:
        CapacityError: No split fits; the message names the smallest split tried and why.
    """
    fits = [r for r in rows if r.plan is not None]
    if not fits:
        last = rows[-1]
        raise CapacityError(
            f"no split of the step fits, down to {last.micro_batches} micro-batches of {last.tokens} tokens: "
            f"{last.reason}"
        )
    return min(fits, key=lambda r: (round(r.step_s or 0.0, 9), r.micro_batches))
