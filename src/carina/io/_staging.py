"""Pinned staging: an aligned host arena with a sub-allocator, and GPU copies.

Reads into a GPU tensor land in a block of the arena (O_DIRECT-aligned,
pinned when CUDA is available), then a dedicated copy stream moves them to
the GPU and records a CUDA event on the request's future; ``stream_wait``
makes a compute stream wait on it without blocking the host. The same code
runs with CPU tensors (a plain copy, no stream), which is how CI tests it.
"""

from __future__ import annotations

import bisect
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from carina.core.errors import ConfigError
from carina.io._buffers import aligned_buffer
from carina.io._future import IOFuture

if TYPE_CHECKING:
    from carina.io._handle import FileHandle

__all__ = ["StagingArena", "StagingEngine", "staged_read", "staged_write"]


class StagingArena:
    """A preallocated, aligned (pinned when CUDA is available) host buffer, sub-allocated.

    Args:
        nbytes: Arena size.
        alignment: Every block starts at a multiple of this.

    Blocks come from a first-fit free list; freed neighbours merge. When the
    arena is full, :meth:`alloc` and :meth:`alloc_array` return a one-off
    allocation instead of waiting (counted in :attr:`overflows`). The memory
    is a torch tensor (pinned when CUDA is available) if torch is loaded when
    the arena is made, else a NumPy array (the engine's bounce buffers for
    misaligned ``O_DIRECT`` requests come from here too, without importing torch).
    """

    def __init__(self, nbytes: int, alignment: int = 4096) -> None:
        self.alignment = alignment
        torch = sys.modules.get("torch")
        self.pinned = bool(torch is not None and torch.cuda.is_available())
        self._tensor: Any = None
        if torch is not None:
            raw = torch.empty(nbytes + alignment, dtype=torch.uint8, pin_memory=self.pinned)
            shift = (-raw.data_ptr()) % alignment
            self._tensor = raw[shift : shift + nbytes]
            self.array: np.ndarray = self._tensor.numpy()
        else:
            self.array = aligned_buffer(nbytes, alignment)
        self.address = int(self.array.ctypes.data)
        self.capacity = nbytes
        self._free: list[tuple[int, int]] = [(0, nbytes)] if nbytes else []
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, tuple[int, int]]] = []
        self.overflows = 0
        self.served = 0  # blocks handed out from the arena
        self.registered = False  # registered with the backend (io_uring fixed buffer)

    @property
    def buffer(self) -> Any:
        """The arena as a flat ``torch.uint8`` CPU tensor (imports torch)."""
        if self._tensor is None:
            import torch

            self._tensor = torch.from_numpy(self.array)
        return self._tensor

    def _take(self, nbytes: int) -> tuple[int, int] | None:
        size = -(-max(nbytes, 1) // self.alignment) * self.alignment
        with self._lock:
            self._reclaim()
            for i, (start, length) in enumerate(self._free):
                if length >= size:
                    self._free[i : i + 1] = [(start + size, length - size)] if length > size else []
                    self.served += 1
                    return start, size
            self.overflows += 1
        return None

    def alloc(self, nbytes: int) -> tuple[Any, tuple[int, int] | None]:
        """Return ``(uint8 tensor of nbytes, block)``; ``block`` is None for a one-off."""
        block = self._take(nbytes)
        if block is not None:
            return self.buffer[block[0] : block[0] + nbytes], block
        import torch

        raw = torch.empty(nbytes + self.alignment, dtype=torch.uint8, pin_memory=self.pinned)
        shift = (-raw.data_ptr()) % self.alignment
        return raw[shift : shift + nbytes], None

    def alloc_array(self, nbytes: int) -> tuple[np.ndarray, tuple[int, int] | None]:
        """Return ``(aligned numpy.uint8 array of nbytes, block)``; ``block`` is None for a one-off."""
        block = self._take(nbytes)
        if block is not None:
            return self.array[block[0] : block[0] + nbytes], block
        return aligned_buffer(nbytes, self.alignment), None

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


class StagingEngine(Protocol):
    """What a staged transfer uses of its engine (:class:`~carina.io.IOEngine`)."""

    def staging_arena(self, *, replace: bool = False) -> StagingArena:
        """The engine's arena (``replace``: a new one)."""

    def read_batch(self, jobs: Iterable[tuple[FileHandle, int, Any]], *, coalesce: bool = True) -> list[IOFuture]:
        """Read ``(handle, offset, buffer)`` jobs."""

    def write_batch(self, jobs: Iterable[tuple[FileHandle, int, Any]], *, coalesce: bool = True) -> list[IOFuture]:
        """Write ``(handle, offset, buffer)`` jobs."""


def _arena(engine: StagingEngine) -> StagingArena:
    """The engine's arena for staged transfers: pinned where CUDA is available.

    An arena made earlier without torch (for bounce buffers) is not pinned; on
    a CUDA machine it is replaced by a pinned one for everything after, and
    kept alive (it may still be registered with the backend or in use).
    """
    arena = engine.staging_arena()
    if not arena.pinned and arena._tensor is None:
        import torch

        if torch.cuda.is_available():
            arena = engine.staging_arena(replace=True)
    return arena


def _flat_bytes(tensor: Any) -> Any:
    import torch

    if not tensor.is_contiguous():
        raise ConfigError("tensor must be contiguous", key="buf")
    return tensor.detach().reshape(-1).view(torch.uint8)


def staged_read(engine: StagingEngine, handle: FileHandle, offset: int, tensor: Any) -> IOFuture:
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


def staged_write(engine: StagingEngine, handle: FileHandle, offset: int, tensor: Any) -> IOFuture:
    """Copy ``tensor`` into the arena (waiting for a GPU copy), then write it asynchronously."""
    src = _flat_bytes(tensor)
    arena = _arena(engine)
    stage, block = arena.alloc(src.numel())
    stage.copy_(src)  # synchronous for a GPU source: the bytes must be on the host first
    fut = engine.write_batch([(handle, offset, stage)], coalesce=False)[0]
    fut.add_done_callback(lambda _: arena.free(block))
    return fut


_STREAMS: dict[int, Any] = {}


def _copy_stream(engine: StagingEngine, device: Any) -> Any:
    import torch

    key = (id(engine) << 8) | (device.index or 0)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=device)
    return _STREAMS[key]
