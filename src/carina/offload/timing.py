"""Where a wrapped model's step time goes: a per-step split, measured only when asked.

With ``Config(step_timing=True)`` the runtime names a *phase* at each of its hooks
(block forward, backward, recompute, waits on streamed weights, swapping
activations out and waiting for them back, waits on the CPU optimizer, gradient
offload, the step tail) and marks
each switch on the compute stream: a CUDA event there on CUDA, a host timestamp on
the CPU. The intervals between consecutive marks partition the compute stream's
timeline from the step's first forward to the end of ``optimizer.step()``, so the
phases add up to the step as the device saw it: a wait phase holds the time the
compute stream stalled (or the host blocked before issuing more work) inside it.

The CPU optimizer's own work (waiting for gradient copies, folding gradients into
the float32 gradient, the update, the cast into the compute-dtype host copy, and for
blocks whose state spills, reading and writing it on NVMe) is timed with
host timers on whichever thread runs it, so its in-process rate can be compared
with the same kernel measured alone.

Every mark costs a CUDA event record (a few microseconds) and the step's end waits
for its last event: cheap, but meant for benchmarks, not left on by default.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["PHASES", "StepTimer", "summarize"]

#: The compute-stream phases, in the order a step meets them.
PHASES = (
    "outside",  # embeddings, head, loss (forward and their backward), anything outside blocks
    "forward",  # blocks' forward compute
    "backward",  # blocks' backward compute (recompute excluded)
    "recompute",  # blocks' forward run again in backward (activation policy recompute)
    "h2d_wait",  # making streamed weights resident: waiting for their prefetch (or, on CPU, copying)
    "act_offload",  # swapping activations out in forward: host buffers and issuing the copies (CPU: copying)
    "act_wait",  # bringing swapped activations back for backward
    "optim_wait",  # blocked on the CPU optimizer: a block's update before its weights can be fetched
    "grad_offload",  # gradient hooks: gradients to host staging or into device accumulators
    "step",  # optimizer.step(): the rest of the updates, draining the worker, planning
)


class StepTimer:
    """Per-step phase split of a wrapped model (see the module docstring).

    Args:
        device: The compute device; CUDA events are used when it is CUDA.
        keep: How many finished steps to keep.
    """

    def __init__(self, device: torch.device, keep: int = 64) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.keep = keep
        self.steps: list[dict[str, float]] = []
        self._stack: list[str] = []
        self._marks: list[tuple[str, Any]] = []
        self._t0 = 0.0
        self._host: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    # -- compute-stream phases (called from the thread issuing device work) ------------------------
    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    @property
    def running(self) -> bool:
        """Whether a step is being timed (its first forward began, its ``step()`` did not end)."""
        return bool(self._marks)

    def begin(self) -> None:
        """The step's first forward starts (later calls in the same step do nothing)."""
        if not self._marks:
            self._t0 = time.perf_counter()
            self._stack = ["outside"]
            self._marks.append(("outside", self._mark()))

    def switch(self, phase: str) -> None:
        """From here on the compute stream is in ``phase`` (replaces the innermost phase)."""
        if not self._marks or self._stack[-1] == phase:
            return
        self._stack[-1] = phase
        self._marks.append((phase, self._mark()))

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """The compute stream is in ``phase`` for the body, then back in the enclosing one."""
        if not self._marks:
            yield
            return
        self._stack.append(phase)
        self._marks.append((phase, self._mark()))
        try:
            yield
        finally:
            self._stack.pop()
            if self._marks:
                self._marks.append((self._stack[-1] if self._stack else "outside", self._mark()))

    # -- host-timed work (any thread) ----------------------------------------------------------------
    def add(self, key: str, value: float) -> None:
        """Add ``value`` to the host-side total ``key`` of the current step (thread-safe)."""
        with self._lock:
            self._host[key] += value

    @contextlib.contextmanager
    def host(self, key: str) -> Iterator[None]:
        """Time the body with a host timer into ``key`` (seconds)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(key, time.perf_counter() - t0)

    def take_host(self) -> dict[str, float]:
        """The host-side totals gathered since the last step ended (or the last call), cleared."""
        with self._lock:
            out = dict(self._host)
            self._host.clear()
        return out

    # -- the step's end -----------------------------------------------------------------------------
    def end_step(self) -> dict[str, float] | None:
        """Close the step: resolve its marks into seconds per phase and keep the split.

        Returns:
            ``{phase}_s`` for every phase, ``device_s`` (their sum: the first forward to the
            end of ``step()`` on the compute stream), ``wall_s`` (the same on the host clock)
            and the host-timed optimizer totals; None if no step was being timed.
        """
        if not self._marks:
            return None
        self._marks.append(("outside", self._mark()))
        wall = time.perf_counter() - self._t0
        marks, self._marks, self._stack = self._marks, [], []
        if self.cuda:
            marks[-1][1].synchronize()
        split = dict.fromkeys((f"{p}_s" for p in PHASES), 0.0)
        for (phase, start), (_, end) in itertools.pairwise(marks):
            dt = start.elapsed_time(end) / 1e3 if self.cuda else end - start
            split[f"{phase}_s"] = split.get(f"{phase}_s", 0.0) + dt
        split["device_s"] = sum(split[f"{p}_s"] for p in PHASES)
        split["wall_s"] = wall
        split.update(self.take_host())
        self.steps.append(split)
        del self.steps[: -self.keep]
        return split


def summarize(steps: list[dict[str, float]]) -> dict[str, float]:
    """The median of each key over ``steps`` (e.g. the timed steps of a benchmark)."""
    import statistics

    keys = sorted({k for s in steps for k in s})
    return {k: statistics.median(s.get(k, 0.0) for s in steps) for k in keys}
