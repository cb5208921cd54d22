"""The tier's synchronous path (``read_now`` / ``commit_now``): it does the work, or declines untouched."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from carina.core.errors import BackendUnavailable, IOEngineError
from carina.infra.storage import protocol as p
from carina.infra.storage.slots import WriteLease
from carina.infra.storage.tier import Tier
from carina.testing.storage import RawNbdClient, TierThread, small_tier_config

B = 4096


def _tier(path: Path, engine: str = "inline", codec: str = "lz4") -> Tier:
    return Tier.open(small_tier_config(path, engine=engine, codec=codec, size=1 << 20, block_size=B, slots=4))


def _lease(tier: Tier, offset: int, data: bytes) -> WriteLease:
    lease = tier.try_write_lease(offset, len(data))
    assert lease is not None and lease.slot is not None
    lease.buffer[:] = data
    return lease


def test_commit_now_and_read_now_round_trip_without_a_loop(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "s")
    try:
        data = os.urandom(B) + bytes(B) + b"carina" * 1000 + bytes(2 * B - 6000)
        batches = tier.engine.batches
        assert tier.commit_now(_lease(tier, 2 * B, data))  # no event loop runs: nothing here may await
        assert tier.pool.free == 4
        assert tier.engine.batches == batches + 1
        got = tier.read_now(2 * B + 100, len(data) - 200)
        assert got is not None and tier.pool.free == 3
        assert b"".join(bytes(x) for x in got.buffers) == data[100:-100]
        got.release()
        assert tier.pool.free == 4
        hole = tier.read_now(0, 2 * B)
        assert hole is not None and bytes(hole.buffers[0]) == bytes(2 * B)
        hole.release()
    finally:
        tier.close()


@pytest.mark.parametrize(
    ("offset", "length", "fua"),
    [(100, B, False), (0, B + 10, False), (0, B, True)],
    ids=["partial-head", "partial-tail", "fua"],
)
def test_commit_now_declines_what_must_wait_and_commit_still_lands(
    tmp_path: Path, offset: int, length: int, fua: bool
) -> None:
    tier = _tier(tmp_path / "s")
    try:
        data = os.urandom(length)
        lease = _lease(tier, offset, data)
        assert not tier.commit_now(lease, fua=fua)
        assert lease.slot is not None and tier.pool.free == 3  # declined: the lease still holds its slot

        async def rest() -> bytes:
            await tier.commit(lease, fua=fua)
            got = await tier.read(offset, length)
            try:
                return b"".join(bytes(x) for x in got.buffers)
            finally:
                got.release()

        assert asyncio.run(rest()) == data
        assert tier.pool.free == 4
    finally:
        tier.close()


def test_commit_now_declines_a_block_another_write_holds(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "s")
    try:
        lease = _lease(tier, B, b"\x5a" * B)

        async def held() -> tuple[bool, bool]:
            async with tier.locks.hold(1, 2):
                inside = tier.commit_now(lease)
            return inside, tier.commit_now(lease)

        assert asyncio.run(held()) == (False, True)
        got = tier.read_now(B, B)
        assert got is not None and bytes(got.buffers[0]) == b"\x5a" * B
        got.release()
    finally:
        tier.close()


def test_read_now_declines_without_a_free_slot_or_an_inline_engine(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "a")
    try:
        taken = [tier.pool.try_acquire() for _ in range(4)]
        assert tier.read_now(0, B) is None
        for slot in taken:
            assert slot is not None
            tier.pool.release(slot)
        assert tier.read_now(0, (256 << 10) + 2 * B) is None  # more than one slot holds
    finally:
        tier.close()
    threaded = _tier(tmp_path / "b", engine="thread")
    try:
        assert threaded.read_now(0, B) is None
        lease = _lease(threaded, 0, bytes(B))
        assert not threaded.commit_now(lease)
        threaded.drop(lease)
        with pytest.raises(BackendUnavailable):
            threaded.engine.run_now([])
    finally:
        threaded.close()


def test_read_now_of_a_corrupt_block_raises_and_gives_the_slot_back(tmp_path: Path) -> None:
    tier = _tier(tmp_path / "s")
    try:
        assert tier.commit_now(_lease(tier, 0, os.urandom(B)))
        e = tier.store.entry(0)
        with open(tier.store.log_path, "r+b") as f:
            f.seek(e.loc + e.clen // 2)
            byte = f.read(1)
            f.seek(e.loc + e.clen // 2)
            f.write(bytes([byte[0] ^ 0x01]))
        with pytest.raises(IOEngineError, match="checksum mismatch"):
            tier.read_now(0, B)
        assert tier.pool.free == 4
    finally:
        tier.close()


def test_inline_server_answers_requests_and_counts_them(start_tier: Callable[..., TierThread]) -> None:
    t = start_tier(engine="inline", size=1 << 20, block_size=B)
    c = RawNbdClient(t.port)
    c.go()
    blocks = [bytes([k]) * B for k in range(1, 33)]
    for k, data in enumerate(blocks):
        c.write(k * B, data)
    for k, data in enumerate(blocks):
        assert c.read(k * B, B) == data
    c.disconnect()
    ops = t.server.stats.ops
    assert ops.get("write") == 32 and ops.get("read") == 32
    assert t.server.stats.bytes_written == 32 * B and t.server.stats.bytes_read == 32 * B


def test_replies_to_a_client_that_stops_reading_arrive_whole_and_in_order_of_bytes(
    start_tier: Callable[..., TierThread],
) -> None:
    """Replies leave from their slots by ``writev``; what the socket refuses is copied and queued, never lost."""
    block = 64 << 10
    t = start_tier(engine="inline", size=4 << 20, block_size=block)
    c = RawNbdClient(t.port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)  # a small window: the server's socket fills
    c.go()
    blocks = [os.urandom(block) for _ in range(64)]
    for k, data in enumerate(blocks):
        assert c.write(k * block, data) == 0
    for k in range(64):  # 4 MiB of replies asked for before any is read: the socket fills up
        c.request(p.Cmd.READ, k * block, block, cookie=1000 + k)
    time.sleep(0.3)
    got = {}
    for _ in range(64):
        rep = c.reply(block)
        assert rep.error == 0
        got[rep.cookie] = rep.data
    assert got == {1000 + k: data for k, data in enumerate(blocks)}
    assert c.read(0, block) == blocks[0]
    c.disconnect()
    assert t.server.stats.ops.get("read") == 65
