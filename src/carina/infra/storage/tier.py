"""The middle tier's data path: payload slots, block locking, compress-on-write, decompress-on-read.

The front end receives each WRITE payload straight into a slot of the engine's
arena, placed so that block boundaries of the export fall on block boundaries
of the slot; partial edge blocks are read, decompressed and patched around it;
then every block of the slot is compressed by the engine as one batch and the
store appends the results. READs run the other way and the reply is sent from
the slot. One slot layout (``S`` payload bytes, block size ``B``)::

    | inp: S + B (payload, block aligned) | out: S + B (stored bytes) | edge: 2 B |
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from carina.core.errors import IOEngineError
from carina.infra.storage.codecs import ERR_CHECKSUM, Codec, Job, Op, Result
from carina.infra.storage.config import TierConfig
from carina.infra.storage.engines import PayloadEngine, build_engine
from carina.infra.storage.store import BlockStore

__all__ = ["RangeLock", "ReadResult", "Slot", "SlotPool", "Tier", "WriteLease", "open_engine"]


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


def open_engine(config: TierConfig) -> PayloadEngine:
    """The engine ``config`` names, with an arena for its slots, prepared for the store's block size and codec.

    Every server process calls this before it accepts a connection (one-process servers and each front end of
    ``--frontends``), so no engine warms up inside client requests.
    """
    sc, srv = config.store, config.server
    arena = srv.slots * SlotPool.slot_span(srv.slot_bytes, sc.block_size)
    engine = build_engine(config.engine, arena_bytes=arena, codec=sc.codec.codec)
    try:
        engine.prepare(sc.block_size, sc.codec.codec)
    except BaseException:
        engine.close()
        raise
    return engine


class Tier:
    """Store + engine + slots: the operations an NBD front end calls."""

    def __init__(self, store: BlockStore, engine: PayloadEngine, *, slots: int, slot_bytes: int, codec: Codec) -> None:
        self.store = store
        self.engine = engine
        self.codec = codec
        self.block_size = store.block_size
        self.size = store.size
        self.slot_bytes = slot_bytes
        self.pool = SlotPool(engine.arena.view, slots=slots, slot_bytes=slot_bytes, block_size=self.block_size)
        self.locks = RangeLock()
        self._zero = bytes(self.block_size)

    @classmethod
    def open(cls, config: TierConfig) -> Tier:
        """Open (or create) the store and start the engine ``config`` names."""
        sc, srv = config.store, config.server
        store = BlockStore(sc.path, size=sc.size, block_size=sc.block_size, checkpoint_bytes=sc.checkpoint_bytes)
        try:
            engine = open_engine(config)
        except BaseException:
            store.close()
            raise
        return cls(store, engine, slots=srv.slots, slot_bytes=srv.slot_bytes, codec=sc.codec.codec)

    def close(self) -> None:
        """Checkpoint the store and stop the engine."""
        self.store.close()
        self.engine.close()

    # -- geometry ----------------------------------------------------------------
    def _fits(self, offset: int, length: int) -> bool:
        b = self.block_size
        return -(-(offset % b + length) // b) * b <= self.slot_bytes + b

    def _chunks(self, offset: int, length: int) -> list[tuple[int, int]]:
        out, pos, end = [], offset, offset + length
        while pos < end:
            stop = min(end, pos - pos % self.block_size + self.slot_bytes)
            out.append((pos, stop - pos))
            pos = stop
        return out

    # -- writes ------------------------------------------------------------------
    def try_write_lease(self, offset: int, length: int) -> WriteLease | None:
        """A buffer to receive a WRITE payload into, or ``None`` when no slot is free."""
        if not self._fits(offset, length):
            return WriteLease(offset, length, memoryview(bytearray(length)), None)
        slot = self.pool.try_acquire()
        if slot is None:
            return None
        head = offset % self.block_size
        return WriteLease(offset, length, slot.inp[head : head + length], slot)

    async def write_lease(self, offset: int, length: int) -> WriteLease:
        """Like :meth:`try_write_lease`, waiting for a slot."""
        lease = self.try_write_lease(offset, length)
        if lease is not None:
            return lease
        slot = await self.pool.acquire()
        head = offset % self.block_size
        return WriteLease(offset, length, slot.inp[head : head + length], slot)

    def drop(self, lease: WriteLease) -> None:
        """Abandon a lease whose payload never arrived."""
        if lease.slot is not None:
            self.pool.release(lease.slot)
            lease.slot = None

    async def commit(self, lease: WriteLease, *, fua: bool = False) -> None:
        """Compress and store a received payload; durable on return when ``fua``."""
        try:
            if lease.slot is not None:
                await self._write_chunk(lease.slot, lease.offset, lease.length)
            else:
                slot = await self.pool.acquire()
                try:
                    done = 0
                    for pos, n in self._chunks(lease.offset, lease.length):
                        head = pos % self.block_size
                        slot.inp[head : head + n] = lease.buffer[done : done + n]
                        await self._write_chunk(slot, pos, n)
                        done += n
                finally:
                    self.pool.release(slot)
        finally:
            self.drop(lease)
        if fua:
            await self.store.flush()

    async def _write_chunk(self, slot: Slot, pos: int, n: int) -> None:
        b = self.block_size
        first, head = divmod(pos, b)
        nb = -(-(head + n) // b)
        tail = (head + n) % b
        # partial edge blocks are read-modify-write: exclude other front-end processes from them too
        edge_lock = self.store.exclusive(first, first + nb) if head or tail else contextlib.nullcontext()
        async with self.locks.hold(first, first + nb), edge_lock:
            if head or tail:
                await self._patch_edges(slot, first, nb, head, tail)
            jobs: list[Job] = [
                (Op.COMPRESS, self.codec, slot.inp_off + i * b, b, slot.out_off + i * b, b, 0) for i in range(nb)
            ]
            results = await self.engine.run(jobs)
            payloads = [slot.out[i * b : (i + 1) * b] for i in range(nb)]
            self.store.append(first, results, payloads)

    async def _patch_edges(self, slot: Slot, first: int, nb: int, head: int, tail: int) -> None:
        """Fill the bytes of partial edge blocks around the payload from their stored contents."""
        b = self.block_size
        edges = ([0] if head else []) + ([nb - 1] if tail and (nb > 1 or not head) else [])
        await self._load_blocks(
            slot, [(first + k, slot.out_off + j * b, slot.edge_off + j * b) for j, k in enumerate(edges)]
        )
        if head:
            slot.inp[:head] = slot.edge[:head]
        if tail:
            j = len(edges) - 1
            slot.inp[(nb - 1) * b + tail : nb * b] = slot.edge[j * b + tail : (j + 1) * b]

    async def _load_blocks(self, slot: Slot, wanted: list[tuple[int, int, int]]) -> None:
        """Decompress blocks into arena offsets: ``(block, stored_at, dst)`` triples."""
        arena = self.engine.arena.view
        b = self.block_size
        jobs: list[Job] = []
        where: list[int] = []
        for block, src, dst in wanted:
            e = self.store.entry(block)
            if e.loc < 0:
                arena[dst : dst + b] = self._zero
                continue
            self.store.read_stored(e, arena[src : src + e.clen])
            jobs.append((Op.DECOMPRESS, e.codec, src, e.clen, dst, b, e.crc))
            where.append(block)
        self._check(await self.engine.run(jobs), where)

    def _check(self, results: list[Result], blocks: list[int]) -> None:
        for (_, n, _), block in zip(results, blocks, strict=True):
            if n < 0:
                what = "checksum mismatch" if n == ERR_CHECKSUM else "undecodable data"
                raise IOEngineError(
                    f"stored block failed verification: {what}",
                    path=str(self.store.log_path),
                    offset=block * self.block_size,
                )

    # -- reads -------------------------------------------------------------------
    async def read(self, offset: int, length: int) -> ReadResult:
        """Read ``length`` bytes at ``offset``; release the result once its buffers are sent."""
        slot = await self.pool.acquire()
        try:
            if self._fits(offset, length):
                view = await self._read_chunk(slot, offset, length)
                return ReadResult([view], slot, self.pool)
            out = bytearray(length)
            done = 0
            for pos, n in self._chunks(offset, length):
                out[done : done + n] = await self._read_chunk(slot, pos, n)
                done += n
        except BaseException:
            self.pool.release(slot)
            raise
        self.pool.release(slot)
        return ReadResult([memoryview(out)])

    async def _read_chunk(self, slot: Slot, pos: int, n: int) -> memoryview:
        b = self.block_size
        first, head = divmod(pos, b)
        nb = -(-(head + n) // b)
        await self._load_blocks(slot, [(first + i, slot.out_off + i * b, slot.inp_off + i * b) for i in range(nb)])
        return slot.inp[head : head + n]

    # -- zeroes, trim, flush ---------------------------------------------------------
    async def write_zeroes(self, offset: int, length: int, *, fua: bool = False) -> None:
        """Make ``[offset, offset+length)`` read as zeros (whole blocks become holes)."""
        b = self.block_size
        lo, hi = -(-offset // b), (offset + length) // b
        if lo >= hi:
            await self._write_zero_bytes(offset, length)
        else:
            if offset < lo * b:
                await self._write_zero_bytes(offset, lo * b - offset)
            async with self.locks.hold(lo, hi):
                self.store.append_zero(lo, hi - lo)
            if offset + length > hi * b:
                await self._write_zero_bytes(hi * b, offset + length - hi * b)
        if fua:
            await self.store.flush()

    async def _write_zero_bytes(self, offset: int, length: int) -> None:
        lease = await self.write_lease(offset, length)
        lease.buffer[:] = bytes(length)
        await self.commit(lease)

    async def trim(self, offset: int, length: int) -> None:
        """Discard whole blocks inside the range (partial blocks keep their data)."""
        b = self.block_size
        lo, hi = -(-offset // b), (offset + length) // b
        if lo < hi:
            async with self.locks.hold(lo, hi):
                self.store.append_zero(lo, hi - lo)

    async def flush(self) -> None:
        """Make every acknowledged write durable."""
        await self.store.flush()
