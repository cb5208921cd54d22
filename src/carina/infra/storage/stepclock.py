"""Where a GPU engine's launch thread spends a batch: wall and thread-CPU seconds per named step.

Session 12 on the H200 left the GPU path's host cost per batch as one number
(server CPU per GB, minus what the front end costs without a codec): about
1.2 ms more per batch than ``forward`` for the torch engine, 10-57 ms round
trips for nvCOMP, with nothing to say which step takes it. The batchers time
their steps with a :class:`StepClock` (``plan``: job table, grouping, runs;
``upload``; ``device``: graph replays or eager steps; ``codec``: nVIDIA
nvCOMP's calls; ``download``: the copy back and the wait for the stream;
``scatter``: results back into the arena and into Python tuples, timed once
per group and once per batch for nVIDIA nvCOMP, once per batch for ZVC; ``cpu``: jobs a batcher
leaves to the CPU codecs). ZVC times its one wait per batch as one more ``download``. Wall time
minus thread CPU time is time the thread slept (a blocking wait, the GIL);
with CUDA's spinning waits the two are alike. The engine's report carries the
sums (``engine_step_<name>_{wall,cpu}_s`` and ``..._n``) to the benchmark rows::

    clock = StepClock()
    with clock.step("upload"):
        mover.upload(rows, runs, length)
    clock.report()   # {"engine_step_upload_wall_s": ..., "engine_step_upload_cpu_s": ..., "engine_step_upload_n": 1}

A batch whose steps follow one another (ZVC's) times them as :class:`Laps` instead: each
:meth:`Laps.lap` ends one step and starts the next, so a batch reads the two clocks once per step, not
twice, makes no generator per step and takes the lock once (the thread-CPU clock is a system call, not
a vDSO read, and the clock runs on every batch a client asks for)::

    laps = clock.laps()
    plan = ...;  laps.lap("plan")
    up = ...;    laps.lap("upload")
    laps.close()   # adds the batch's laps to the sums
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["Laps", "StepClock"]


class StepClock:
    """Sums of wall and thread-CPU seconds, and counts, per step name; safe to use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as step ``name`` (in the calling thread's CPU time)."""
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add([(name, time.perf_counter() - w0, time.thread_time() - c0)])

    def laps(self) -> Laps:
        """A :class:`Laps` of this clock, its first lap starting now."""
        return Laps(self)

    def add(self, laps: list[tuple[str, float, float]]) -> None:
        """Add ``(name, wall, cpu)`` seconds of steps (one count each), under one lock."""
        with self._lock:
            sums = self._sums
            for name, wall, cpu in laps:
                acc = sums.setdefault(name, [0.0, 0.0, 0.0])
                acc[0] += wall
                acc[1] += cpu
                acc[2] += 1

    def reset(self) -> None:
        """Forget everything timed so far (an engine's warm-up is not a batch a client asked for)."""
        with self._lock:
            self._sums.clear()

    def report(self) -> dict[str, float]:
        """``engine_step_<name>_wall_s``, ``..._cpu_s`` and ``..._n`` (times the step ran) for every step."""
        out: dict[str, float] = {}
        with self._lock:
            for name, (wall, cpu, n) in sorted(self._sums.items()):
                out |= {f"engine_step_{name}_wall_s": wall, f"engine_step_{name}_cpu_s": cpu,
                        f"engine_step_{name}_n": n}  # fmt: skip
        return out


class Laps:
    """One batch's consecutive steps on one thread: each :meth:`lap` ends a step begun at the last mark.

    Args:
        clock: The :class:`StepClock` that :meth:`close` adds the laps to.
    """

    __slots__ = ("_clock", "_cpu", "_got", "_wall")

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock
        self._got: list[tuple[str, float, float]] = []
        self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def lap(self, name: str) -> None:
        """Time from the last mark to now is one step ``name``; now is the next mark."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self._got.append((name, wall - self._wall, cpu - self._cpu))
        self._wall, self._cpu = wall, cpu

    def close(self) -> None:
        """Add the laps so far to the clock (once: later laps are dropped)."""
        got, self._got = self._got, []
        if got:
            self._clock.add(got)
