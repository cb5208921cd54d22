"""Payload slots of the engine's arena, block range locks, and the leases and results that hold slots.

A slot holds one request's payload (``inp``), its stored bytes (``out``) and
the partial edge blocks around it (``edge``); :class:`SlotPool` hands slots
out and queues waiters when all are taken. :class:`RangeLock` excludes
overlapping block ranges within one process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["RangeLock", "ReadResult", "Slot", "SlotPool", "WriteLease"]


@dataclass(eq=False)
class Slot:
    """One payload buffer of the arena, with its stored-bytes and edge-block regions."""

    index: int
    inp_off: int
    out_off: int
    edge_off: int
    inp: memoryview
    out: memoryview
    edge: memoryview


class SlotPool:
    """Fixed payload slots carved from an arena; waiters queue when all are taken."""

    def __init__(self, arena: memoryview, *, slots: int, slot_bytes: int, block_size: int) -> None:
        span = self.slot_span(slot_bytes, block_size)
        region = slot_bytes + block_size
        self._free: list[Slot] = []
        for i in range(slots):
            base = i * span
            inp, out, edge = base, base + region, base + 2 * region
            self._free.append(
                Slot(
                    i,
                    inp,
                    out,
                    edge,
                    arena[inp : inp + region],
                    arena[out : out + region],
                    arena[edge : edge + 2 * block_size],
                )
            )
        self._waiters: list[asyncio.Future[Slot]] = []

    @staticmethod
    def slot_span(slot_bytes: int, block_size: int) -> int:
        """Arena bytes one slot takes."""
        return 2 * (slot_bytes + block_size) + 2 * block_size

    @property
    def free(self) -> int:
        """Slots not in use."""
        return len(self._free)

    def try_acquire(self) -> Slot | None:
        """A free slot, or ``None`` without waiting."""
        return self._free.pop() if self._free and not self._waiters else None

    async def acquire(self) -> Slot:
        """A free slot, waiting for one if needed."""
        slot = self.try_acquire()
        if slot is not None:
            return slot
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise

    def release(self, slot: Slot) -> None:
        """Give ``slot`` back (to the first waiter, if any)."""
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(slot)
                return
        self._free.append(slot)


class RangeLock:
    """Excludes overlapping block ranges (read-modify-write and map updates of a block)."""

    def __init__(self) -> None:
        self._held: list[tuple[int, int]] = []  # ranges of several blocks
        self._single: set[int] = set()  # single blocks (most requests: one block), checked in O(1)
        self._waiters: list[asyncio.Future[None]] = []

    def _free(self, lo: int, hi: int) -> bool:
        if hi - lo == 1:
            if lo in self._single:
                return False
        elif self._single:  # the smaller side: blocks of the range, or the single blocks held
            if hi - lo <= len(self._single):
                if any(b in self._single for b in range(lo, hi)):
                    return False
            elif any(lo <= b < hi for b in self._single):
                return False
        return all(hi <= a or b <= lo for a, b in self._held)

    def available(self, lo: int, hi: int) -> bool:
        """Whether blocks ``[lo, hi)`` could be held now without waiting (and no one queues for a range)."""
        return not self._waiters and self._free(lo, hi)

    @contextlib.asynccontextmanager
    async def hold(self, lo: int, hi: int) -> AsyncIterator[None]:
        """Hold blocks ``[lo, hi)`` for the body of the ``async with`` (no await when uncontended)."""
        while not self._free(lo, hi):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut
        single = hi - lo == 1
        if single:
            self._single.add(lo)
        else:
            self._held.append((lo, hi))
        try:
            yield
        finally:
            if single:
                self._single.discard(lo)
            else:
                self._held.remove((lo, hi))
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)


@dataclass(eq=False)
class WriteLease:
    """Where a WRITE payload is to be received: ``buffer`` (a slot view or a private buffer)."""

    offset: int
    length: int
    buffer: memoryview
    slot: Slot | None


@dataclass(eq=False)
class ReadResult:
    """READ data as buffers to send; call ``release`` once they are sent."""

    buffers: list[memoryview | bytes]
    slot: Slot | None = None
    _pool: SlotPool | None = field(default=None, repr=False)

    def release(self) -> None:
        """Return the slot the data lives in."""
        if self.slot is not None and self._pool is not None:
            self._pool.release(self.slot)
            self.slot = None
