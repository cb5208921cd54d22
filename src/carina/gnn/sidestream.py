"""The sampler thread's own CUDA stream, so sampling and cache lookups stop queueing behind the step.

On one stream every kernel runs in issue order. The sampler thread samples batch ``i+2`` and plans
its cache lookup while the caller trains on batch ``i``, but its kernels queue behind the step's,
and each of its host waits (``torch.unique``'s size, the lookup's ``nonzero``, the misses' ids
coming to the CPU) waits for the step too: on the H200 in session 9 the pipelined in-memory run took
the sum of the sampler's and the step's times, not their maximum (sampler 20.0 ms a batch in the
pipeline against 11.6 ms alone; ``docs/gnn.md``). With a stream of its own the sampler's kernels and
waits see only its own work.

A batch crosses streams once, at the hand-over: the sampler thread records an event after the
batch is sampled and planned (:meth:`SideStream.mark`); before the caller's stream assembles
the batch's features it waits for that event, and every device tensor of the batch and its plan
is marked as used by the caller's stream (``Tensor.record_stream``), so the caching allocator
does not give its memory back to the sampler stream while the step still reads it
(:meth:`SideStream.hand_over`). The kernels are the same on either stream, so the batches, and
the losses, are bit for bit the same.

CPU tensors have no streams (a CPU run takes no side stream); :class:`SideStream` is a protocol
so the pipeline's hand-over order is tested on the CPU with a recording stand-in
(:class:`carina.testing.gnn.RecordingSideStream`).

:class:`StageEvents` times the sampler's stages on its stream in device time: an event is recorded
before the sample, between the sample and the cache lookup, and after the lookup, and the elapsed
times are read lazily (a pair is read once its end event has completed, polled without waiting;
the rest at the end of the run), so the timing adds no wait to the sampler's loop. What a pair
measures is the stream's span from the first event to the second: the stage's kernels and any
gap in which the stream waited for the sampler thread to issue the next one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

__all__ = [
    "CudaSideStream",
    "SideStream",
    "StageEvents",
    "TimingEvent",
    "cuda_stage_events",
    "side_stream",
    "tensors_in",
]


class SideStream(Protocol):
    """What the pipeline needs from the sampler's stream."""

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """Make the stream current in the calling (sampler) thread for the body."""

    def mark(self) -> Any:
        """A token for the work issued on the stream so far (a batch sampled and planned)."""

    def hand_over(self, token: Any, tensors: Iterable[torch.Tensor]) -> None:
        """Make the caller's current stream wait for ``token`` and keep ``tensors`` alive for it."""


class CudaSideStream:
    """A CUDA stream of the sampler thread's own, on ``device``.

    It starts after the work already queued on the creating thread's stream (the graph and the
    cache were copied there).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.cuda.stream`` of this stream."""
        return torch.cuda.stream(self.stream)

    def mark(self) -> torch.cuda.Event:
        """An event recorded on the stream now."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def hand_over(self, token: Any, tensors: Iterable[torch.Tensor]) -> None:
        """The current stream waits for ``token``; each CUDA tensor is recorded as used by it."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(token)
        for t in tensors:
            if t.is_cuda:
                t.record_stream(current)


def side_stream(device: torch.device | str, enabled: bool = True) -> CudaSideStream | None:
    """The sampler's own stream on a CUDA ``device`` (None on the CPU, or when not ``enabled``)."""
    device = torch.device(device)
    if not enabled or device.type != "cuda":
        return None
    return CudaSideStream(device)


class TimingEvent(Protocol):
    """What :class:`StageEvents` needs from an event (``torch.cuda.Event(enable_timing=True)``)."""

    def record(self) -> None:
        """Record on the calling thread's current stream."""

    def query(self) -> bool:
        """Whether the work before the event has completed (does not wait)."""

    def synchronize(self) -> None:
        """Wait for the work before the event."""

    def elapsed_time(self, end: Any, /) -> float:
        """Milliseconds from this event to ``end`` (both completed)."""


class StageEvents:
    """Device time of named stages from pairs of events, read one completed pair at a time.

    :meth:`stamp` records a new event on the current stream; :meth:`add` files a pair under a stage
    and reads every pending pair whose end has completed (``query``, no wait); :meth:`finish` waits
    for the rest (call it after the run) and returns each stage's seconds per call, in order.

    Args:
        new_event: Makes an unrecorded timing event.
    """

    def __init__(self, new_event: Callable[[], TimingEvent]) -> None:
        self._new_event = new_event
        self._pending: list[tuple[str, TimingEvent, TimingEvent]] = []
        self._done: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def stamp(self) -> TimingEvent:
        """A new event recorded on the calling thread's current stream."""
        event = self._new_event()
        event.record()
        return event

    def add(self, stage: str, start: TimingEvent, end: TimingEvent) -> None:
        """File the pair ``start``-``end`` under ``stage``; read the pairs that have completed."""
        with self._lock:
            self._pending.append((stage, start, end))
            while self._pending and self._pending[0][2].query():
                self._read(*self._pending.pop(0))

    def finish(self) -> dict[str, list[float]]:
        """Wait for the pending pairs; each stage's device seconds per call, in the order filed."""
        with self._lock:
            for stage, start, end in self._pending:
                end.synchronize()
                self._read(stage, start, end)
            self._pending = []
            return {k: list(v) for k, v in self._done.items()}

    def _read(self, stage: str, start: TimingEvent, end: TimingEvent) -> None:
        self._done.setdefault(stage, []).append(start.elapsed_time(end) / 1e3)


def cuda_stage_events() -> StageEvents:
    """:class:`StageEvents` of CUDA timing events."""
    return StageEvents(lambda: torch.cuda.Event(enable_timing=True))


def tensors_in(obj: Any, _depth: int = 4) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``: itself, or in its dataclass fields, lists, tuples and dict values."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif _depth == 0 or obj is None:
        return
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors_in(getattr(obj, f.name), _depth - 1)
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from tensors_in(item, _depth - 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item, _depth - 1)
