from __future__ import annotations

import asyncio
import os
import zlib
from pathlib import Path

import pytest

from carina.core.errors import ConfigError, IOEngineError
from carina.infra.storage.codecs import Codec
from carina.infra.storage.store import BlockStore, read_store_summary

B = 4096


def _put(store: BlockStore, block: int, payload: bytes) -> None:
    store.append(block, [(Codec.RAW, len(payload), zlib.crc32(payload))], [memoryview(payload)])


def _get(store: BlockStore, block: int) -> bytes:
    e = store.entry(block)
    if e.loc < 0:
        return bytes(B)
    buf = memoryview(bytearray(e.clen))
    store.read_stored(e, buf)
    assert zlib.crc32(buf) == e.crc
    return bytes(buf)


def test_records_survive_reopen_without_checkpoint(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, size=64 * B, block_size=B)
    blocks = {i: os.urandom(B) for i in (0, 5, 63)}
    for i, data in blocks.items():
        _put(store, i, data)
    _put(store, 5, b"\x01" * B)  # overwrite: the later record wins
    store.append_zero(60, 4)  # trims block 63
    os.close(store._fd)  # a crash: no fsync, no map checkpoint
    again = BlockStore(tmp_path, size=64 * B, block_size=B)
    assert again.replayed == 5
    assert _get(again, 0) == blocks[0] and _get(again, 5) == b"\x01" * B and _get(again, 63) == bytes(B)
    again.close()
    third = BlockStore(tmp_path, size=64 * B, block_size=B)
    assert third.replayed == 0 and _get(third, 0) == blocks[0]  # came from map.bin
    third.close()


def test_torn_tail_is_cut_and_earlier_records_kept(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, size=16 * B, block_size=B)
    _put(store, 1, b"a" * B)
    _put(store, 2, b"b" * B)
    os.close(store._fd)
    log = tmp_path / "data.log"
    size = log.stat().st_size
    with open(log, "r+b") as f:  # half of the last record reached the disk
        f.truncate(size - B // 2)
    again = BlockStore(tmp_path, size=16 * B, block_size=B)
    assert _get(again, 1) == b"a" * B and _get(again, 2) == bytes(B)
    assert log.stat().st_size == again.tail
    _put(again, 3, b"c" * B)  # appends continue after the cut
    again.close()
    assert _get(BlockStore(tmp_path, size=16 * B, block_size=B), 3) == b"c" * B


def test_corrupt_record_payload_stops_replay(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, size=16 * B, block_size=B)
    _put(store, 1, b"a" * B)
    loc = store.entry(1).loc
    _put(store, 2, b"b" * B)
    os.close(store._fd)
    with open(tmp_path / "data.log", "r+b") as f:
        f.seek(loc + 10)
        f.write(b"X")
    again = BlockStore(tmp_path, size=16 * B, block_size=B)
    assert again.entry(1).loc < 0 and again.entry(2).loc < 0


def test_corrupt_map_checkpoint_falls_back_to_full_replay(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, size=16 * B, block_size=B)
    _put(store, 7, b"z" * B)
    store.close()
    raw = bytearray((tmp_path / "map.bin").read_bytes())
    raw[-1] ^= 0xFF
    (tmp_path / "map.bin").write_bytes(bytes(raw))
    again = BlockStore(tmp_path, size=16 * B, block_size=B)
    assert again.replayed == 1 and _get(again, 7) == b"z" * B


def test_flush_checkpoints_after_enough_growth(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, size=16 * B, block_size=B, checkpoint_bytes=2 * B)
    _put(store, 0, b"q" * B)
    asyncio.run(store.flush())
    assert not (tmp_path / "map.bin").exists()
    _put(store, 1, b"r" * B)
    asyncio.run(store.flush())
    assert (tmp_path / "map.bin").exists()


def test_geometry_mismatch_and_summary(tmp_path: Path) -> None:
    store = BlockStore(tmp_path, size=16 * B, block_size=B)
    _put(store, 0, b"q" * 100)
    store.close()
    with pytest.raises(ConfigError, match="block_size"):
        BlockStore(tmp_path, size=16 * B, block_size=2 * B)
    summary = read_store_summary(tmp_path)
    assert summary["mapped_blocks"] == 1 and summary["stored_bytes"] == 100 and summary["ratio"] == B / 100
    with pytest.raises(IOEngineError, match="no carina store"):
        read_store_summary(tmp_path / "nothing")
