"""Pinned staging: an aligned host arena with a sub-allocator, and GPU copies.

Reads into a GPU tensor land in a block of the arena (O_DIRECT-aligned,
pinned when CUDA is available), then a dedicated copy stream moves them to
the GPU and records a CUDA event on the request's future; ``stream_wait``
makes a compute stream wait on it without blocking the host. The same code
runs with CPU tensors (a plain copy, no stream), which is how CI tests it.
"""

from __future__ import annotations

import bisect
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from carina.core.errors import ConfigError
from carina.io._future import IOFuture

if TYPE_CHECKING:
    from carina.io._engine import IOEngine
    from carina.io._handle import FileHandle

__all__ = ["StagingArena", "staged_read", "staged_write"]


class StagingArena:
    """A preallocated, aligned (pinned when CUDA is available) host buffer, sub-allocated.

    Args:
        nbytes: Arena size.
        alignment: Every block starts at a multiple of this.

    Blocks come from a first-fit free list; freed neighbours merge. When the
    arena is full, :meth:`alloc` returns a one-off allocation instead of
    waiting (counted in :attr:`overflows`).
    """

    def __init__(self, nbytes: int, alignment: int = 4096) -> None:
        import torch

        self.alignment = alignment
        self.pinned = bool(torch.cuda.is_available())
        raw = torch.empty(nbytes + alignment, dtype=torch.uint8, pin_memory=self.pinned)
        shift = (-raw.data_ptr()) % alignment
        self.buffer = raw[shift : shift + nbytes]
        self.capacity = nbytes
        self._free: list[tuple[int, int]] = [(0, nbytes)] if nbytes else []
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, tuple[int, int]]] = []
        self.overflows = 0
        self.registered = False  # registered with the backend (io_uring fixed buffer)

    def alloc(self, nbytes: int) -> tuple[Any, tuple[int, int] | None]:
        """Return ``(uint8 tensor of nbytes, block)``; ``block`` is None for a one-off."""
        size = -(-max(nbytes, 1) // self.alignment) * self.alignment
        with self._lock:
            self._reclaim()
            for i, (start, length) in enumerate(self._free):
                if length >= size:
                    self._free[i : i + 1] = [(start + size, length - size)] if length > size else []
                    return self.buffer[start : start + nbytes], (start, size)
            self.overflows += 1
        import torch

        raw = torch.empty(nbytes + self.alignment, dtype=torch.uint8, pin_memory=self.pinned)
        shift = (-raw.data_ptr()) % self.alignment
        return raw[shift : shift + nbytes], None

    def free(self, block: tuple[int, int] | None, after: Any = None) -> None:
        """Return ``block``; with a CUDA event ``after``, only once the event has completed."""
        if block is None:
            return
        with self._lock:
            if after is not None and not after.query():
                self._pending.append((after, block))
                return
            self._insert(block)

    @property
    def used(self) -> int:
        """Bytes currently handed out."""
        with self._lock:
            return self.capacity - sum(length for _, length in self._free)

    def _reclaim(self) -> None:
        still = []
        for event, block in self._pending:
            if event.query():
                self._insert(block)
            else:
                still.append((event, block))
        self._pending = still

    def _insert(self, block: tuple[int, int]) -> None:
        i = bisect.bisect(self._free, block)
        self._free.insert(i, block)
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free = merged


def _arena(engine: IOEngine) -> StagingArena:
    if engine._staging is None:
        arena = StagingArena(engine.config.bounce_bytes, engine.config.alignment)
        arena.registered = engine.backend.register_memory(arena.buffer.data_ptr(), arena.capacity)
        engine._staging = arena
    arena = engine._staging
    return arena


def _flat_bytes(tensor: Any) -> Any:
    import torch

    if not tensor.is_contiguous():
        raise ConfigError("tensor must be contiguous", key="buf")
    return tensor.detach().reshape(-1).view(torch.uint8)


def staged_read(engine: IOEngine, handle: FileHandle, offset: int, tensor: Any) -> IOFuture:
    """Read into ``tensor`` (any device) through the arena; see the module docstring."""
    import torch

    dst = _flat_bytes(tensor)
    arena = _arena(engine)
    stage, block = arena.alloc(dst.numel())
    inner = engine.read_batch([(handle, offset, stage)], coalesce=False)[0]
    outer = IOFuture(inner.request)

    def finish(done: Future[int]) -> None:
        exc = done.exception()
        if not outer.set_running_or_notify_cancel():
            arena.free(block)
            return
        if exc is not None:
            arena.free(block)
            outer.set_exception(exc)
            return
        if dst.device.type == "cuda":
            stream = _copy_stream(engine, dst.device)
            with torch.cuda.stream(stream):
                dst.copy_(stage, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            outer.cuda_event = event
            arena.free(block, after=event)
        else:
            dst.copy_(stage)
            arena.free(block)
        outer.set_result(done.result())

    inner.add_done_callback(finish)
    return outer


def staged_write(engine: IOEngine, handle: FileHandle, offset: int, tensor: Any) -> IOFuture:
    """Copy ``tensor`` into the arena (waiting for a GPU copy), then write it asynchronously."""
    src = _flat_bytes(tensor)
    arena = _arena(engine)
    stage, block = arena.alloc(src.numel())
    stage.copy_(src)  # synchronous for a GPU source: the bytes must be on the host first
    fut = engine.write_batch([(handle, offset, stage)], coalesce=False)[0]
    fut.add_done_callback(lambda _: arena.free(block))
    return fut


_STREAMS: dict[int, Any] = {}


def _copy_stream(engine: IOEngine, device: Any) -> Any:
    import torch

    key = (id(engine) << 8) | (device.index or 0)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=device)
    return _STREAMS[key]
