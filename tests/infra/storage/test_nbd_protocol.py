from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import StorageProtocolError
from carina.infra.storage import protocol as p


def test_request_round_trip() -> None:
    req = p.Request(flags=1, cmd=p.Cmd.WRITE, cookie=0xDEADBEEF, offset=4096, length=512)
    assert p.parse_request(p.encode_request(req)) == req
    assert len(p.encode_request(req)) == p.REQUEST_HEADER


def test_bad_magic_is_a_protocol_error() -> None:
    raw = bytearray(p.encode_request(p.Request(0, p.Cmd.READ, 1, 0, 512)))
    raw[0] ^= 0xFF
    with pytest.raises(StorageProtocolError, match="magic"):
        p.parse_request(bytes(raw))


def test_oversized_write_is_a_protocol_error_but_big_read_is_not() -> None:
    big = p.MAX_PAYLOAD + 1
    with pytest.raises(StorageProtocolError, match="32 MiB"):
        p.parse_request(p.encode_request(p.Request(0, p.Cmd.WRITE, 1, 0, big)))
    assert p.parse_request(p.encode_request(p.Request(0, p.Cmd.READ, 1, 0, big))).length == big


def test_export_request_parses_name_and_infos() -> None:
    data = struct.pack(">I", 3) + b"abc" + struct.pack(">HHH", 2, p.Info.NAME, p.Info.BLOCK_SIZE)
    req = p.parse_export_request(data)
    assert req.name == "abc" and req.infos == (p.Info.NAME, p.Info.BLOCK_SIZE)


@pytest.mark.parametrize(
    "data",
    [b"", struct.pack(">I", 10) + b"ab\0\0", struct.pack(">I", 1) + b"\xff\0\0", struct.pack(">I", 0) + b"\0\2\0\1"],
)
def test_malformed_export_requests(data: bytes) -> None:
    with pytest.raises(StorageProtocolError):
        p.parse_export_request(data)


def test_client_flags() -> None:
    assert p.parse_client_flags(struct.pack(">I", 3)) == 3
    with pytest.raises(StorageProtocolError, match="unknown"):
        p.parse_client_flags(struct.pack(">I", 4 | 1))
    with pytest.raises(StorageProtocolError, match="fixed newstyle"):
        p.parse_client_flags(struct.pack(">I", 0))


def test_structured_error_chunk_layout() -> None:
    raw = p.structured_error(7, p.Errno.EIO, "boom")
    magic, flags, rtype, cookie, length = struct.unpack(">IHHQI", raw[:20])
    assert (magic, flags, rtype, cookie, length) == (p.STRUCTURED_REPLY_MAGIC, 1, (1 << 15) + 1, 7, 10)
    assert struct.unpack(">IH", raw[20:26]) == (5, 4) and raw[26:] == b"boom"


# -- fuzzing: any bytes either parse or raise StorageProtocolError, nothing else ----------


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=28, max_size=28))
def test_fuzz_request_header(raw: bytes) -> None:
    try:
        req = p.parse_request(raw)
    except StorageProtocolError:
        assert raw[:4] != struct.pack(">I", p.REQUEST_MAGIC) or struct.unpack(">H", raw[6:8])[0] == p.Cmd.WRITE
        return
    assert p.encode_request(req) == raw


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_any_length_request(raw: bytes) -> None:
    if len(raw) != p.REQUEST_HEADER:
        with pytest.raises(StorageProtocolError):
            p.parse_request(raw)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(min_size=16, max_size=16),
        st.builds(
            lambda o, n: struct.pack(">QII", p.IHAVEOPT, o, n), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)
        ),
    )
)
def test_fuzz_option_header(raw: bytes) -> None:
    try:
        head = p.parse_option_header(raw)
    except StorageProtocolError:
        return
    assert head.length <= p.MAX_OPTION_DATA
    assert struct.pack(">QII", p.IHAVEOPT, head.option, head.length) == raw


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_fuzz_export_request(raw: bytes) -> None:
    try:
        req = p.parse_export_request(raw)
    except StorageProtocolError:
        return
    name = req.name.encode()
    rebuilt = struct.pack(">I", len(name)) + name + struct.pack(f">H{len(req.infos)}H", len(req.infos), *req.infos)
    assert rebuilt == raw


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=8))
def test_fuzz_client_flags(raw: bytes) -> None:
    try:
        flags = p.parse_client_flags(raw)
    except StorageProtocolError:
        return
    assert flags in (1, 3) and len(raw) == 4
