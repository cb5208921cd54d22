"""The back end: compressed blocks in an append-only, checksummed log plus a block map.

``data.log`` starts with a 4 KiB header (block size, export size) and then holds
records, each a 36-byte header followed by its payload::

    magic "CRBK" | kind u8 | codec u8 | pad u16 | clen u32 | seq u64 | block u64 | data crc u32 | hdr crc u32

``kind`` is DATA (``clen`` stored bytes of one block follow) or ZERO (``clen``
blocks from ``block`` on read as zeros; nothing follows). The block map
(offset, length, codec, CRC per block) lives in memory; ``map.bin`` is a
checkpoint of it, written atomically (temp file, fsync, rename, fsync folder)
with the log position it covers. Opening loads the checkpoint and replays the
log after it, checking every record's CRCs and cutting a torn tail, so an
acknowledged write survives the server being killed, and a flushed one survives
the machine losing power.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from carina.core.errors import ConfigError, DeviceFull, IOEngineError
from carina.infra.storage.codecs import Codec, Result

__all__ = ["BlockStore", "Entry", "StoreStats", "read_store_summary"]

log = logging.getLogger("carina.infra.storage")

_FILE = struct.Struct("<16sIIQ")
_FILE_MAGIC = b"CARINA-STORE-v1\0"
_DATA_START = 4096
_REC = struct.Struct("<4sBBHIQQII")
_REC_MAGIC = b"CRBK"
_MAP = struct.Struct("<16sQQQI")
_MAP_MAGIC = b"CARINA-BMAP-v1\0\0"
KIND_DATA = 1
KIND_ZERO = 2
HOLE = -1


@dataclass(frozen=True)
class Entry:
    """Where one block lives: ``loc`` < 0 means it reads as zeros."""

    loc: int
    clen: int
    codec: Codec
    crc: int


@dataclass(frozen=True)
class StoreStats:
    """Space accounting of a store."""

    blocks: int
    mapped_blocks: int
    logical_bytes: int
    stored_bytes: int
    log_bytes: int

    @property
    def ratio(self) -> float:
        """Logical bytes of mapped blocks over their stored (compressed) bytes."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 0.0


def _record(kind: int, codec: int, clen: int, seq: int, block: int, dcrc: int) -> bytes:
    head = _REC.pack(_REC_MAGIC, kind, codec, 0, clen, seq, block, dcrc, 0)
    return head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))


class BlockStore:
    """A crash-consistent store of compressed blocks.

    Args:
        directory: Folder of ``data.log`` and ``map.bin`` (created if absent).
        size: Export size when creating; checked against an existing store.
        block_size: Block size when creating; checked against an existing store.
        checkpoint_bytes: Log growth after which :meth:`flush` rewrites ``map.bin``.
        readonly: Inspect only (another process may be serving it): nothing is written or cut.
    """

    def __init__(
        self,
        directory: Path,
        *,
        size: int,
        block_size: int,
        checkpoint_bytes: int = 256 << 20,
        readonly: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.log_path = self.directory / "data.log"
        self.map_path = self.directory / "map.bin"
        self.checkpoint_bytes = checkpoint_bytes
        self.readonly = readonly
        fresh = not self.log_path.exists() or self.log_path.stat().st_size < _DATA_START
        if readonly:
            if fresh:
                raise IOEngineError("no carina store here", path=str(self.log_path))
            self._fd = os.open(self.log_path, os.O_RDONLY)
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        if fresh:
            self._create(size, block_size)
        self.block_size, self.size = self._read_header(size, block_size)
        self.nblocks = self.size // self.block_size
        self.loc = np.full(self.nblocks, HOLE, dtype=np.int64)
        self.clen = np.zeros(self.nblocks, dtype=np.uint32)
        self.codec = np.zeros(self.nblocks, dtype=np.uint8)
        self.crc = np.zeros(self.nblocks, dtype=np.uint32)
        self.seq = 0
        self.tail = _DATA_START
        self.replayed = self._recover()
        self._checkpointed = self.tail
        self._flush_lock: asyncio.Lock | None = None

    # -- opening ---------------------------------------------------------------
    def _create(self, size: int, block_size: int) -> None:
        header = _FILE.pack(_FILE_MAGIC, 1, block_size, size).ljust(_DATA_START, b"\0")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, header, 0)
        os.fsync(self._fd)
        self.map_path.unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def _read_header(self, size: int, block_size: int) -> tuple[int, int]:
        raw = os.pread(self._fd, _FILE.size, 0)
        magic, version, bs, sz = _FILE.unpack(raw)
        if magic != _FILE_MAGIC or version != 1:
            raise IOEngineError("not a carina store (bad log header)", path=str(self.log_path))
        if (bs, sz) != (block_size, size):
            raise ConfigError(
                f"store was created with size={sz} block_size={bs}, asked for size={size} block_size={block_size}",
                key="store",
            )
        return bs, sz

    def _recover(self) -> int:
        """Load the map checkpoint, then replay the log after it; return records replayed."""
        start = self._load_map()
        end = os.fstat(self._fd).st_size
        pos, count = start, 0
        with open(self.log_path, "rb", buffering=1 << 20) as f:
            f.seek(pos)
            while pos + _REC.size <= end:
                head = f.read(_REC.size)
                parsed = self._parse_record(head)
                if parsed is None:
                    break
                kind, codec, clen, seq, block, dcrc = parsed
                data = f.read(clen) if kind == KIND_DATA else b""
                if kind == KIND_DATA and (len(data) != clen or zlib.crc32(data) != dcrc):
                    break
                self._apply(kind, codec, clen, block, pos + _REC.size, dcrc)
                self.seq = seq
                pos += _REC.size + len(data)
                count += 1
        if pos < end and not self.readonly:
            log.warning("store %s: cutting %d bytes of torn log tail at %d", self.directory, end - pos, pos)
            os.ftruncate(self._fd, pos)
        self.tail = pos
        return count

    def _parse_record(self, head: bytes) -> tuple[int, int, int, int, int, int] | None:
        if len(head) != _REC.size:
            return None
        magic, kind, codec, _, clen, seq, block, dcrc, hcrc = _REC.unpack(head)
        if magic != _REC_MAGIC or zlib.crc32(head[:-4]) != hcrc or kind not in (KIND_DATA, KIND_ZERO):
            return None
        last = block + (clen if kind == KIND_ZERO else 1)
        if last > self.nblocks or seq <= self.seq or codec not in Codec._value2member_map_:
            return None
        return kind, codec, clen, seq, block, dcrc

    def _load_map(self) -> int:
        try:
            raw = self.map_path.read_bytes()
        except FileNotFoundError:
            return _DATA_START
        n = self.nblocks
        want = _MAP.size + n * 17
        if len(raw) != want:
            log.warning("store %s: ignoring map checkpoint of wrong size", self.directory)
            return _DATA_START
        magic, log_end, seq, nblocks, crc = _MAP.unpack_from(raw)
        body = memoryview(raw)[_MAP.size :]
        if magic != _MAP_MAGIC or nblocks != n or zlib.crc32(body) != crc:
            log.warning("store %s: ignoring corrupt map checkpoint", self.directory)
            return _DATA_START
        self.loc[:] = np.frombuffer(body[: 8 * n], dtype=np.int64)
        self.clen[:] = np.frombuffer(body[8 * n : 12 * n], dtype=np.uint32)
        self.codec[:] = np.frombuffer(body[12 * n : 13 * n], dtype=np.uint8)
        self.crc[:] = np.frombuffer(body[13 * n : 17 * n], dtype=np.uint32)
        self.seq = seq
        return int(log_end)

    def _apply(self, kind: int, codec: int, clen: int, block: int, data_at: int, dcrc: int) -> None:
        if kind == KIND_ZERO:
            sl = slice(block, block + clen)
            self.loc[sl], self.clen[sl], self.codec[sl], self.crc[sl] = HOLE, 0, 0, 0
        else:
            self.loc[block], self.clen[block], self.codec[block], self.crc[block] = data_at, clen, codec, dcrc

    # -- blocks ------------------------------------------------------------------
    def entry(self, block: int) -> Entry:
        """Where ``block`` lives."""
        return Entry(int(self.loc[block]), int(self.clen[block]), Codec(int(self.codec[block])), int(self.crc[block]))

    def read_stored(self, entry: Entry, dst: memoryview) -> None:
        """Read the stored bytes of a mapped block into ``dst[:entry.clen]``."""
        got = os.preadv(self._fd, [dst[: entry.clen]], entry.loc)
        if got != entry.clen:
            raise IOEngineError("short read from the block log", path=str(self.log_path), offset=entry.loc)

    def append(self, first: int, results: Sequence[Result], payloads: Sequence[memoryview]) -> None:
        """Append compressed blocks ``first, first+1, ...`` (from engine results) and map them.

        Returns only once the log holds every record (in the page cache: it
        survives the process; :meth:`flush` makes it survive power loss).
        """
        bufs: list[bytes | memoryview] = []
        placed: list[tuple[int, int, int, int, int, int]] = []
        pos = self.tail
        for i, ((codec, clen, crc), payload) in enumerate(zip(results, payloads, strict=True)):
            self.seq += 1
            if clen == 0:
                bufs.append(_record(KIND_ZERO, 0, 1, self.seq, first + i, 0))
                placed.append((KIND_ZERO, 0, 1, first + i, 0, 0))
            else:
                bufs += [_record(KIND_DATA, codec, clen, self.seq, first + i, crc), payload[:clen]]
                placed.append((KIND_DATA, codec, clen, first + i, pos + _REC.size, crc))
            pos += _REC.size + (clen if clen else 0)
        self._write(bufs, pos)
        for rec in placed:
            self._apply(*rec)

    def append_zero(self, first: int, count: int) -> None:
        """Record that ``count`` blocks from ``first`` read as zeros (TRIM, WRITE_ZEROES)."""
        self.seq += 1
        self._write([_record(KIND_ZERO, 0, count, self.seq, first, 0)], self.tail + _REC.size)
        self._apply(KIND_ZERO, 0, count, first, 0, 0)

    def _write(self, bufs: list[bytes | memoryview], new_tail: int) -> None:
        want = new_tail - self.tail
        done = 0
        try:
            while done < want:  # pwritev may write less than asked; finish the rest
                n = os.pwritev(self._fd, bufs, self.tail + done) if done == 0 else self._write_rest(bufs, done)
                done += n
        except OSError as exc:
            cls = DeviceFull if exc.errno == errno.ENOSPC else IOEngineError
            raise cls(
                f"cannot append to the block log: {exc.strerror}", path=str(self.log_path), offset=self.tail
            ) from exc
        self.tail = new_tail

    def _write_rest(self, bufs: list[bytes | memoryview], done: int) -> int:
        flat = b"".join(bytes(b) for b in bufs)[done:]
        return os.pwrite(self._fd, flat, self.tail + done)

    def exclusive(self, lo: int, hi: int) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold blocks ``[lo, hi)`` against other processes sharing the store (none share a private one)."""
        return contextlib.nullcontext()

    # -- durability --------------------------------------------------------------
    async def flush(self) -> None:
        """Make every appended record durable; rewrite the map when the log grew enough."""
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        async with self._flush_lock:
            snapshot = self._snapshot() if self.tail - self._checkpointed >= self.checkpoint_bytes else None
            await loop.run_in_executor(None, os.fsync, self._fd)
            if snapshot is not None:
                await loop.run_in_executor(None, self._write_map, snapshot)

    def _snapshot(self) -> tuple[int, int, bytes]:
        body = b"".join(a.tobytes() for a in (self.loc, self.clen, self.codec, self.crc))
        return self.tail, self.seq, body

    def _write_map(self, snapshot: tuple[int, int, bytes]) -> None:
        log_end, seq, body = snapshot
        tmp = self.map_path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(_MAP.pack(_MAP_MAGIC, log_end, seq, self.nblocks, zlib.crc32(body)))
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.map_path)
        _fsync_dir(self.directory)
        self._checkpointed = log_end

    def close(self) -> None:
        """Fsync the log, checkpoint the map, close the file."""
        if self._fd < 0:
            return
        if not self.readonly:
            os.fsync(self._fd)
            self._write_map(self._snapshot())
        os.close(self._fd)
        self._fd = -1

    def stats(self) -> StoreStats:
        """Space accounting from the block map."""
        mapped = self.loc >= 0
        n = int(mapped.sum())
        return StoreStats(
            blocks=self.nblocks,
            mapped_blocks=n,
            logical_bytes=n * self.block_size,
            stored_bytes=int(self.clen[mapped].sum(dtype=np.int64)),
            log_bytes=self.tail,
        )


def read_store_summary(directory: Path) -> dict[str, int | float | str]:
    """Geometry and space accounting of a store, read without changing it.

    Raises:
        IOEngineError: ``directory`` holds no carina store.
    """
    log_path = Path(directory) / "data.log"
    try:
        with open(log_path, "rb") as f:
            raw = f.read(_FILE.size)
    except FileNotFoundError:
        raw = b""
    if len(raw) != _FILE.size or _FILE.unpack(raw)[0] != _FILE_MAGIC:
        raise IOEngineError("no carina store here", path=str(log_path))
    _, _, block_size, size = _FILE.unpack(raw)
    store = BlockStore(Path(directory), size=size, block_size=block_size, readonly=True)
    try:
        st = store.stats()
    finally:
        store.close()
    return {
        "path": str(directory),
        "size": size,
        "block_size": block_size,
        "blocks": st.blocks,
        "mapped_blocks": st.mapped_blocks,
        "logical_bytes": st.logical_bytes,
        "stored_bytes": st.stored_bytes,
        "ratio": round(st.ratio, 4),
        "log_bytes": st.log_bytes,
    }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
