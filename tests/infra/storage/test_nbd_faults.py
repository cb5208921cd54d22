"""Bad input on the wire: the offending connection closes or gets an error; the server and store live on."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carina.infra.storage import protocol as p
from carina.testing.storage import NbdReply, RawNbdClient, TierThread, qemu_io


@pytest.fixture
def tier(start_tier: Callable[..., TierThread]) -> TierThread:
    t = start_tier(engine="inline", size=1 << 20, block_size=4096)
    qemu_io(t.url, "write -P 0x77 0 64K")
    return t


def _still_serving(tier: TierThread) -> None:
    qemu_io(tier.url, "read -P 0x77 0 64K", "read -P 0 64K 64K")


def test_wrong_request_magic_closes_only_that_connection(tier: TierThread) -> None:
    bystander = RawNbdClient(tier.port)
    bystander.go()
    bad = RawNbdClient(tier.port)
    bad.go()
    bad.sock.sendall(b"\x00" * 28)
    assert bad.closed_by_server()
    assert bystander.read(0, 16) == b"\x77" * 16
    bystander.disconnect()
    assert tier.server.stats.protocol_errors == 1
    _still_serving(tier)


def test_out_of_range_requests_get_errors_and_keep_the_connection(tier: TierThread) -> None:
    c = RawNbdClient(tier.port)
    c.go()
    assert c.size == 1 << 20
    c.request(p.Cmd.READ, (1 << 20) - 10, 20, cookie=5)
    assert c.reply() == NbdReply(5, p.Errno.EINVAL)
    assert c.write((1 << 20) - 2, b"abcd") == p.Errno.ENOSPC  # payload consumed, stream still in sync
    c.request(p.Cmd.READ, 0, p.MAX_PAYLOAD + 1, cookie=6)
    assert c.reply().error == p.Errno.EOVERFLOW
    c.request(p.Cmd.BLOCK_STATUS, 0, 4096, cookie=7)
    assert c.reply().error == p.Errno.EINVAL
    c.request(p.Cmd.WRITE_ZEROES, 0, 4096, cookie=8, flags=1 << 9)
    assert c.reply().error == p.Errno.EINVAL
    assert c.read(0, 8) == b"\x77" * 8
    c.disconnect()
    _still_serving(tier)


def test_oversized_write_closes_the_connection(tier: TierThread) -> None:
    c = RawNbdClient(tier.port)
    c.go()
    c.request(p.Cmd.WRITE, 0, p.MAX_PAYLOAD + 1)
    assert c.closed_by_server()
    _still_serving(tier)


def test_handshake_errors_are_structured_option_replies(tier: TierThread) -> None:
    c = RawNbdClient(tier.port)
    c.greet()
    [(rtype, msg)] = c.option(99)
    assert rtype == p.Rep.ERR_UNSUP and b"not supported" in msg
    [(rtype, _)] = c.option(p.Opt.LIST, b"junk")
    assert rtype == p.Rep.ERR_INVALID
    [(rtype, _)] = c.option(p.Opt.SET_META_CONTEXT, b"")
    assert rtype == p.Rep.ERR_INVALID  # needs structured replies first
    name = b"nope"
    [(rtype, msg)] = c.option(p.Opt.GO, struct.pack(">I", len(name)) + name + b"\0\0")
    assert rtype == p.Rep.ERR_UNKNOWN and b"nope" in msg
    [(rtype, _)] = c.option(p.Opt.GO, b"\0\0\0\xff\0\0")  # name length past the data
    assert rtype == p.Rep.ERR_INVALID
    replies = c.option(p.Opt.INFO, struct.pack(">IH", 0, 0))  # "" is the default export
    assert replies[-1][0] == p.Rep.ACK
    assert c.option(p.Opt.ABORT) == [(p.Rep.ACK, b"")]
    assert c.closed_by_server()


def test_handshake_framing_violations_close(tier: TierThread) -> None:
    c = RawNbdClient(tier.port)
    c.greet(flags=1 << 7 | 1)
    assert c.closed_by_server()
    c = RawNbdClient(tier.port)
    c.greet()
    c.sock.sendall(struct.pack(">QII", p.IHAVEOPT, p.Opt.GO, p.MAX_OPTION_DATA + 1))
    assert c.closed_by_server()
    _still_serving(tier)


def test_structured_replies_carry_errors_and_data(tier: TierThread) -> None:
    c = RawNbdClient(tier.port)
    c.greet()
    assert c.option(p.Opt.STRUCTURED_REPLY) == [(p.Rep.ACK, b"")]
    c.option(p.Opt.GO, struct.pack(">IH", 0, 0))
    c.request(p.Cmd.READ, 65440, 200, cookie=9)
    magic, flags, rtype, cookie, length = struct.unpack(">IHHQI", c.recv_exact(20))
    assert (magic, flags, rtype, cookie, length) == (p.STRUCTURED_REPLY_MAGIC, 1, 1, 9, 208)
    body = c.recv_exact(length)
    assert struct.unpack(">Q", body[:8])[0] == 65440 and body[8:104] == b"\x77" * 96 and body[104:] == bytes(104)
    c.request(p.Cmd.READ, 1 << 20, 1, cookie=10)
    magic, flags, rtype, cookie, length = struct.unpack(">IHHQI", c.recv_exact(20))
    error, msglen = struct.unpack(">IH", c.recv_exact(6))
    assert (rtype, cookie, error) == ((1 << 15) + 1, 10, p.Errno.EINVAL) and len(c.recv_exact(msglen)) == msglen
    c.disconnect()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=200))
def test_fuzz_garbage_after_go_never_hurts_the_server(tier: TierThread, junk: bytes) -> None:
    c = RawNbdClient(tier.port, timeout=2)
    c.go()
    c.sock.sendall(junk)
    c.sock.shutdown(1)  # no more bytes: the server must answer or close, never hang or crash
    c.closed_by_server()
    c.close()
    assert tier.server.tier.store.entry(0).loc >= 0  # the store still maps what was written
    _still_serving(tier)


def test_pipelined_writes_beyond_the_slot_count_all_land(start_tier: Callable[..., TierThread]) -> None:
    """Twenty writes sent before any reply, with 2 slots: reading pauses and resumes, none is lost."""
    tier = start_tier(engine="inline", size=1 << 20, block_size=4096, slots=2)
    c = RawNbdClient(tier.port)
    c.go()
    blob = b"".join(
        p.encode_request(p.Request(0, p.Cmd.WRITE, 100 + i, i * 8192, 6000)) + bytes([i + 1]) * 6000 for i in range(20)
    )
    c.sock.sendall(blob)
    replies = [c.reply() for _ in range(20)]
    assert sorted(r.cookie for r in replies) == list(range(100, 120)) and all(r.error == 0 for r in replies)
    for i in range(20):
        assert c.read(i * 8192, 6000) == bytes([i + 1]) * 6000
        assert c.read(i * 8192 + 6000, 2192) == bytes(2192)
    c.disconnect()
