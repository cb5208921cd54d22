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

import contextlib

from carina.core.errors import IOEngineError
from carina.infra.storage.codecs import ERR_CHECKSUM, Codec, Job, Op, Result
from carina.infra.storage.config import TierConfig
from carina.infra.storage.engines import PayloadEngine, build_engine
from carina.infra.storage.slots import RangeLock, ReadResult, Slot, SlotPool, WriteLease
from carina.infra.storage.store import BlockStore

__all__ = ["RangeLock", "ReadResult", "Slot", "SlotPool", "Tier", "WriteLease", "open_engine"]


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
            results = await self.engine.run(self._compress_jobs(slot, nb))
            self.store.append(first, results, [slot.out[i * b : (i + 1) * b] for i in range(nb)])

    def _compress_jobs(self, slot: Slot, nb: int) -> list[Job]:
        b = self.block_size
        return [(Op.COMPRESS, self.codec, slot.inp_off + i * b, b, slot.out_off + i * b, b, 0) for i in range(nb)]

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
        jobs, where = self._load_jobs(wanted)
        self._check(await self.engine.run(jobs), where)

    def _load_jobs(self, wanted: list[tuple[int, int, int]]) -> tuple[list[Job], list[int]]:
        """Read the stored bytes of ``(block, stored_at, dst)`` (holes: zero ``dst``); their decompress jobs."""
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
        return jobs, where

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
        await self._load_blocks(slot, self._chunk_blocks(slot, pos, n))
        head = pos % self.block_size
        return slot.inp[head : head + n]

    def _chunk_blocks(self, slot: Slot, pos: int, n: int) -> list[tuple[int, int, int]]:
        """The ``(block, stored_at, dst)`` triples that put bytes ``[pos, pos+n)`` into ``slot.inp``."""
        b = self.block_size
        first, head = divmod(pos, b)
        return [(first + i, slot.out_off + i * b, slot.inp_off + i * b) for i in range(-(-(head + n) // b))]

    # -- without a coroutine ---------------------------------------------------------
    def read_now(self, offset: int, length: int) -> ReadResult | None:
        """:meth:`read`, done before returning; ``None`` (nothing done) where it would have to wait.

        It runs with an engine that :attr:`~PayloadEngine.runs_inline` when a slot is free and the range fits
        one slot: most READs of the one-process tier, which then cost no task, coroutine or future.
        """
        if not self.engine.runs_inline or not self._fits(offset, length):
            return None
        slot = self.pool.try_acquire()
        if slot is None:
            return None
        try:
            jobs, where = self._load_jobs(self._chunk_blocks(slot, offset, length))
            self._check(self.engine.run_now(jobs), where)
        except BaseException:
            self.pool.release(slot)
            raise
        head = offset % self.block_size
        return ReadResult([slot.inp[head : head + length]], slot, self.pool)

    def commit_now(self, lease: WriteLease, *, fua: bool = False) -> bool:
        """:meth:`commit`, done before returning; ``False`` (the lease untouched) where it would have to wait.

        It would wait for FUA's flush, an engine that hands jobs off, partial edge blocks (read-modify-write,
        locked against other front ends) or blocks another write holds. Otherwise the blocks are compressed and
        appended here, as :meth:`commit` does under the range lock (nothing else runs meanwhile).
        """
        slot = lease.slot
        if fua or slot is None or not lease.length or not self.engine.runs_inline:
            return False
        b = self.block_size
        first, head = divmod(lease.offset, b)
        nb, tail = divmod(head + lease.length, b)
        if head or tail or not self.locks.available(first, first + nb):
            return False
        try:
            results = self.engine.run_now(self._compress_jobs(slot, nb))
            self.store.append(first, results, [slot.out[i * b : (i + 1) * b] for i in range(nb)])
        finally:
            self.drop(lease)
        return True

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
