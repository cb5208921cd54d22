"""A bounded pipeline that overlaps sampling, disk reads and training.

Three stages run at once on different batches: a sampler thread samples batch
``i+2`` and plans its cache lookup, an IO thread reads the misses of batch
``i+1``, and the caller trains on batch ``i``. A semaphore of ``depth`` slots
bounds the batches alive at any moment (sampled but not yet trained), so
memory stays bounded however slow the consumer is; :attr:`max_in_flight`
records the highest count seen, which tests hold to the bound. ``depth=1`` runs
the stages one after another (the serial baseline) through the same code. With
``side`` (a :mod:`carina.gnn.sidestream`), the sampler thread issues its device
work on a stream of its own and hands each batch over to the caller's stream, and with ``events``
(a :class:`carina.gnn.sidestream.StageEvents`) it also times its sample and cache lookup on that
stream in device time (:meth:`FeaturePipeline.device_calls`, after the run)::

    pipe = FeaturePipeline(sampler.batches(train_idx, 1024), store, depth=3)
    for batch, x in pipe:
        loss = step(batch, x)
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from carina.core.errors import ConfigError
from carina.gnn.sampler import SampledBatch
from carina.gnn.sidestream import SideStream, StageEvents, tensors_in

__all__ = ["FeaturePipeline", "FeatureSource", "StageTimes"]

_STOP = object()
_POLL = 0.05


class FeatureSource(Protocol):
    """What the pipeline needs from a feature store (plan / read / assemble)."""

    def plan(self, n_id: torch.Tensor) -> Any:
        """Cache lookup and IO plan of a batch."""

    def read(self, plan: Any) -> torch.Tensor:
        """Blocking reads of the plan's misses."""

    def assemble(self, plan: Any, missing: torch.Tensor) -> torch.Tensor:
        """The batch's rows on the compute device."""


@dataclass
class StageTimes:
    """Seconds spent in each stage, summed over batches (stages overlap in time), and each call's.

    :attr:`calls` keeps every call's seconds in order, so a measurement can leave out the
    warm-up batches (the first call of a stage also pays for fresh buffers and kernels).
    """

    sample: float = 0.0
    plan: float = 0.0
    read: float = 0.0
    assemble: float = 0.0
    batches: int = 0
    calls: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to stage ``name`` (one more call of it in :attr:`calls`)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + seconds)
            self.calls.setdefault(name, []).append(seconds)

    def as_dict(self) -> dict[str, float]:
        """Per-stage totals."""
        return {k: getattr(self, k) for k in ("sample", "plan", "read", "assemble")}

    def as_counts(self) -> dict[str, int]:
        """How many times each stage ran (a read ahead that nobody trained on counts too)."""
        with self._lock:
            return {k: len(self.calls.get(k, ())) for k in ("sample", "plan", "read", "assemble")}

    def as_calls(self) -> dict[str, list[float]]:
        """Each stage's calls, in the order they ran."""
        with self._lock:
            return {k: list(self.calls.get(k, [])) for k in ("sample", "plan", "read", "assemble")}


class FeaturePipeline:
    """Iterate ``(batch, features)`` with sampling and IO running ahead.

    Args:
        batches: Yields sampled batches (sampling happens inside ``next``).
        source: The feature store.
        depth: Most batches alive at once (>= 1; 1 = no overlap).
        deadline: A ``time.perf_counter()`` instant (0: none) after which the IO thread starts
            no further read (the first batch is always read), so a time-boxed epoch does not
            wait for a read ahead it will not use.
        side: The sampler thread's own stream (None: the sampler's work goes on the stream
            current in its thread, the device's default one). Unused when ``depth`` is 1.
        events: Device timing of the sampler's stages on ``side`` (None: none). Unused without
            ``side``: on the device's stream the span would take in the step's work too.
    """

    def __init__(
        self,
        batches: Iterator[SampledBatch],
        source: FeatureSource,
        *,
        depth: int = 3,
        deadline: float = 0.0,
        side: SideStream | None = None,
        events: StageEvents | None = None,
    ) -> None:
        if depth < 1:
            raise ConfigError("pipeline depth must be >= 1", key="depth")
        self.depth = depth
        self.deadline = deadline
        self.side = side if depth > 1 else None
        self.events = events if self.side is not None else None
        self._reads = 0
        self.times = StageTimes()
        self.max_in_flight = 0
        self._batches = iter(batches)
        self._source = source
        self._slots = threading.Semaphore(depth)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stop = threading.Event()
        self._planned: queue.Queue[Any] = queue.Queue()
        self._ready: queue.Queue[Any] = queue.Queue()
        self._threads: list[threading.Thread] = []

    def __iter__(self) -> Iterator[tuple[SampledBatch, torch.Tensor]]:
        if self.depth == 1:
            yield from self._serial()
            return
        self._threads = [
            threading.Thread(target=self._guard, args=(self._sample_loop,), name="gnn-sample", daemon=True),
            threading.Thread(target=self._guard, args=(self._read_loop,), name="gnn-read", daemon=True),
        ]
        for t in self._threads:
            t.start()
        try:
            while True:
                item = self._ready.get()
                if item is _STOP:
                    break
                if isinstance(item, BaseException):
                    raise item
                batch, plan, missing, token = item
                if self.side is not None:  # the caller's stream waits for the sampler's work on this batch
                    self.side.hand_over(token, tensors_in((batch, plan)))
                t0 = time.perf_counter()
                x = self._source.assemble(plan, missing)
                self.times.add("assemble", time.perf_counter() - t0)
                yield batch, x
                self._release()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the worker threads (also when the consumer leaves early)."""
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []

    def device_calls(self) -> dict[str, list[float]]:
        """Device seconds of each sampler stage per call (``sample``, ``plan``), in order.

        ``{}`` without ``events``. Waits for the sampler's last events: call it after the run.
        """
        return self.events.finish() if self.events is not None else {}

    def _serial(self) -> Iterator[tuple[SampledBatch, torch.Tensor]]:
        while True:
            self._acquire_slot()
            t0 = time.perf_counter()
            batch = next(self._batches, None)
            if batch is None:
                return
            self.times.add("sample", time.perf_counter() - t0)
            plan = self._timed("plan", self._source.plan, batch.n_id)
            missing = self._timed("read", self._source.read, plan)
            x = self._timed("assemble", self._source.assemble, plan, missing)
            yield batch, x
            self._release()

    def _timed(self, stage: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.times.add(stage, time.perf_counter() - t0)
        return out

    def _acquire_slot(self) -> bool:
        while not self._slots.acquire(timeout=_POLL):
            if self._stop.is_set():
                return False
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        return True

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1
        self.times.batches += 1
        self._slots.release()

    def _guard(self, loop: Any) -> None:
        try:
            loop()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._ready.put(exc)

    def _sample_loop(self) -> None:
        side, ev = self.side, self.events
        with side.context() if side is not None else contextlib.nullcontext():
            while not self._stop.is_set():
                if not self._acquire_slot():
                    return
                e0 = ev.stamp() if ev is not None else None
                t0 = time.perf_counter()
                batch = next(self._batches, None)
                if batch is None:
                    self._planned.put(_STOP)
                    return
                self.times.add("sample", time.perf_counter() - t0)
                e1 = ev.stamp() if ev is not None else None
                plan = self._timed("plan", self._source.plan, batch.n_id)
                if ev is not None and e0 is not None and e1 is not None:  # read lazily: no wait (StageEvents)
                    e2 = ev.stamp()
                    ev.add("sample", e0, e1)
                    ev.add("plan", e1, e2)
                self._planned.put((batch, plan, side.mark() if side is not None else None))

    def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._planned.get(timeout=_POLL)
            except queue.Empty:
                continue
            if item is _STOP or isinstance(item, BaseException):
                self._ready.put(item)
                return
            if self.deadline and self._reads and time.perf_counter() > self.deadline:
                self._ready.put(_STOP)  # past the time box: no read ahead that nobody will train on
                return
            batch, plan, token = item
            missing = self._timed("read", self._source.read, plan)
            self._reads += 1
            self._ready.put((batch, plan, missing, token))
