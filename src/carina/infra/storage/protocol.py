"""The NBD wire protocol (fixed newstyle): constants, frame parsers and reply encoders.

Pure functions over bytes, no IO, so the parsers can be fuzzed. Every parser
raises :class:`~carina.core.errors.StorageProtocolError` for input the protocol
does not allow; the server then closes that connection. Field layouts follow
the NBD protocol document (``doc/proto.md`` of the NBD project)::

    request     magic u32 | flags u16 | type u16 | cookie u64 | offset u64 | length u32   (28 B)
    simple rep  magic u32 | error u32 | cookie u64                                       (16 B)
    structured  magic u32 | flags u16 | type u16 | cookie u64 | length u32 | payload     (20 B + n)
    option      magic u64 | option u32 | length u32 | data                               (16 B + n)
    option rep  magic u64 | option u32 | type u32 | length u32 | data                    (20 B + n)
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from carina.core.errors import StorageProtocolError

__all__ = [
    "CLIENT_FLAGS",
    "CMD_NAMES",
    "FUA_BIT",
    "KNOWN_FLAGS",
    "MAX_OPTION_DATA",
    "MAX_PAYLOAD",
    "OPTION_HEADER",
    "REQUEST_HEADER",
    "TRANSMISSION_FLAGS",
    "Cmd",
    "CmdFlag",
    "Errno",
    "ExportInfoRequest",
    "HandshakeFlag",
    "Info",
    "OptionHeader",
    "Opt",
    "Rep",
    "Request",
    "TransmissionFlag",
    "encode_request",
    "export_name_reply",
    "greeting",
    "info_block_size",
    "info_export",
    "info_name",
    "option_reply",
    "parse_client_flags",
    "parse_export_request",
    "parse_option_header",
    "parse_request",
    "simple_reply",
    "structured_data_header",
    "structured_done",
    "structured_error",
]

NBDMAGIC = 0x4E42444D41474943  # "NBDMAGIC"
IHAVEOPT = 0x49484156454F5054  # "IHAVEOPT"
REPLY_MAGIC = 0x0003E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

REQUEST_HEADER = 28
OPTION_HEADER = 16
#: Largest payload a client may send or ask for (the protocol's customary 32 MiB).
MAX_PAYLOAD = 32 << 20
#: Largest option data the server accepts during the handshake.
MAX_OPTION_DATA = 4096

_REQUEST = struct.Struct(">IHHQQI")
_OPTION = struct.Struct(">QII")
_OPTION_REPLY = struct.Struct(">QIII")
_SIMPLE = struct.Struct(">IIQ")
_STRUCTURED = struct.Struct(">IHHQI")


class HandshakeFlag(enum.IntFlag):
    """Server handshake flags (sent after ``IHAVEOPT``)."""

    FIXED_NEWSTYLE = 1
    NO_ZEROES = 2


#: Client flags this server understands; any other bit closes the connection.
CLIENT_FLAGS = 0b11


class TransmissionFlag(enum.IntFlag):
    """Per-export flags sent with the export size."""

    HAS_FLAGS = 1 << 0
    READ_ONLY = 1 << 1
    SEND_FLUSH = 1 << 2
    SEND_FUA = 1 << 3
    ROTATIONAL = 1 << 4
    SEND_TRIM = 1 << 5
    SEND_WRITE_ZEROES = 1 << 6
    SEND_DF = 1 << 7
    CAN_MULTI_CONN = 1 << 8


#: Flags advertised with the export: flush, FUA, trim, write zeroes, several connections at once.
TRANSMISSION_FLAGS = int(
    TransmissionFlag.HAS_FLAGS
    | TransmissionFlag.SEND_FLUSH
    | TransmissionFlag.SEND_FUA
    | TransmissionFlag.SEND_TRIM
    | TransmissionFlag.SEND_WRITE_ZEROES
    | TransmissionFlag.CAN_MULTI_CONN
)


class Opt(enum.IntEnum):
    """Handshake options."""

    EXPORT_NAME = 1
    ABORT = 2
    LIST = 3
    STARTTLS = 5
    INFO = 6
    GO = 7
    STRUCTURED_REPLY = 8
    LIST_META_CONTEXT = 9
    SET_META_CONTEXT = 10
    EXTENDED_HEADERS = 11


class Rep(enum.IntEnum):
    """Option reply types; the ``ERR_`` ones carry an optional UTF-8 message."""

    ACK = 1
    SERVER = 2
    INFO = 3
    META_CONTEXT = 4
    ERR_UNSUP = (1 << 31) + 1
    ERR_POLICY = (1 << 31) + 2
    ERR_INVALID = (1 << 31) + 3
    ERR_PLATFORM = (1 << 31) + 4
    ERR_TLS_REQD = (1 << 31) + 5
    ERR_UNKNOWN = (1 << 31) + 6
    ERR_SHUTDOWN = (1 << 31) + 7
    ERR_BLOCK_SIZE_REQD = (1 << 31) + 8
    ERR_TOO_BIG = (1 << 31) + 9


class Info(enum.IntEnum):
    """Information types of ``NBD_REP_INFO``."""

    EXPORT = 0
    NAME = 1
    DESCRIPTION = 2
    BLOCK_SIZE = 3


class Cmd(enum.IntEnum):
    """Transmission commands."""

    READ = 0
    WRITE = 1
    DISC = 2
    FLUSH = 3
    TRIM = 4
    CACHE = 5
    WRITE_ZEROES = 6
    BLOCK_STATUS = 7


class CmdFlag(enum.IntFlag):
    """Command flags."""

    FUA = 1 << 0
    NO_HOLE = 1 << 1
    DF = 1 << 2
    REQ_ONE = 1 << 3
    FAST_ZERO = 1 << 4


#: Every command flag carina accepts, and FUA alone, as plain ints (``int & IntFlag`` runs enum code per request).
KNOWN_FLAGS = int(CmdFlag.FUA | CmdFlag.NO_HOLE | CmdFlag.DF | CmdFlag.FAST_ZERO)
FUA_BIT = int(CmdFlag.FUA)
#: The stats' name of each command.
CMD_NAMES: dict[int, str] = {Cmd.READ: "read", Cmd.WRITE: "write", Cmd.FLUSH: "flush", Cmd.TRIM: "trim",
                             Cmd.WRITE_ZEROES: "write_zeroes", Cmd.CACHE: "cache"}  # fmt: skip


class Errno(enum.IntEnum):
    """Error values on the wire (fixed by the protocol, not the host's errno)."""

    OK = 0
    EPERM = 1
    EIO = 5
    ENOMEM = 12
    EINVAL = 22
    ENOSPC = 28
    EOVERFLOW = 75
    ENOTSUP = 95
    ESHUTDOWN = 108


_REPLY_TYPE_NONE = 0
_REPLY_TYPE_OFFSET_DATA = 1
_REPLY_TYPE_ERROR = (1 << 15) + 1
_REPLY_FLAG_DONE = 1


# -- handshake -----------------------------------------------------------------


def greeting() -> bytes:
    """The server's first 18 bytes: ``NBDMAGIC``, ``IHAVEOPT``, handshake flags."""
    flags = HandshakeFlag.FIXED_NEWSTYLE | HandshakeFlag.NO_ZEROES
    return struct.pack(">QQH", NBDMAGIC, IHAVEOPT, flags)


def parse_client_flags(buf: bytes | memoryview) -> int:
    """Parse the client's 4-byte flags; unknown bits or no fixed newstyle are violations."""
    if len(buf) != 4:
        raise StorageProtocolError("client flags must be 4 bytes", got=len(buf))
    (flags,) = struct.unpack(">I", buf)
    if flags & ~CLIENT_FLAGS:
        raise StorageProtocolError("client sent unknown handshake flags", flags=hex(flags))
    if not flags & HandshakeFlag.FIXED_NEWSTYLE:
        raise StorageProtocolError("client does not speak fixed newstyle", flags=hex(flags))
    return int(flags)


@dataclass(frozen=True)
class OptionHeader:
    """A parsed option header; ``length`` bytes of data follow."""

    option: int
    length: int


def parse_option_header(buf: bytes | memoryview) -> OptionHeader:
    """Parse a 16-byte option header.

    Raises:
        StorageProtocolError: Wrong magic or option data longer than :data:`MAX_OPTION_DATA`.
    """
    if len(buf) != OPTION_HEADER:
        raise StorageProtocolError("option header must be 16 bytes", got=len(buf))
    magic, option, length = _OPTION.unpack(buf)
    if magic != IHAVEOPT:
        raise StorageProtocolError("bad option magic", magic=hex(magic))
    if length > MAX_OPTION_DATA:
        raise StorageProtocolError("option data too long", option=option, length=length)
    return OptionHeader(option=option, length=length)


@dataclass(frozen=True)
class ExportInfoRequest:
    """The data of ``NBD_OPT_INFO``/``NBD_OPT_GO``: an export name and info types wanted."""

    name: str
    infos: tuple[int, ...]


def parse_export_request(data: bytes | memoryview) -> ExportInfoRequest:
    """Parse ``u32 name length, name, u16 count, u16 info...``.

    Raises:
        StorageProtocolError: The lengths do not add up or the name is not UTF-8.
    """
    data = bytes(data)
    if len(data) < 6:
        raise StorageProtocolError("export request shorter than 6 bytes", got=len(data))
    (name_len,) = struct.unpack_from(">I", data, 0)
    if 4 + name_len + 2 > len(data):
        raise StorageProtocolError("export name runs past the option data", name_length=name_len)
    try:
        name = data[4 : 4 + name_len].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StorageProtocolError("export name is not UTF-8", position=exc.start) from None
    (count,) = struct.unpack_from(">H", data, 4 + name_len)
    rest = data[6 + name_len :]
    if len(rest) != 2 * count:
        raise StorageProtocolError("info request count does not match its data", count=count, got=len(rest))
    infos = struct.unpack(f">{count}H", rest) if count else ()
    return ExportInfoRequest(name=name, infos=tuple(infos))


def option_reply(option: int, rtype: int, data: bytes = b"") -> bytes:
    """Encode one option reply."""
    return _OPTION_REPLY.pack(REPLY_MAGIC, option, rtype, len(data)) + data


def info_export(size: int, flags: int) -> bytes:
    """``NBD_INFO_EXPORT`` payload: size and transmission flags."""
    return struct.pack(">HQH", Info.EXPORT, size, flags)


def info_name(name: str) -> bytes:
    """``NBD_INFO_NAME`` payload."""
    return struct.pack(">H", Info.NAME) + name.encode("utf-8")


def info_block_size(minimum: int, preferred: int, maximum: int) -> bytes:
    """``NBD_INFO_BLOCK_SIZE`` payload."""
    return struct.pack(">HIII", Info.BLOCK_SIZE, minimum, preferred, maximum)


def export_name_reply(size: int, flags: int, *, no_zeroes: bool) -> bytes:
    """The reply to the old ``NBD_OPT_EXPORT_NAME``: size, flags, maybe 124 zero bytes."""
    return struct.pack(">QH", size, flags) + (b"" if no_zeroes else bytes(124))


# -- transmission --------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A parsed request header (a WRITE's ``length`` bytes of payload follow it)."""

    flags: int
    cmd: int
    cookie: int
    offset: int
    length: int

    @property
    def has_payload(self) -> bool:
        """Whether ``length`` bytes of data follow this header on the wire."""
        return self.cmd == Cmd.WRITE


def parse_request(buf: bytes | memoryview) -> Request:
    """Parse a 28-byte request header.

    Only framing is checked here (magic, a WRITE payload the server will not
    take); the meaning of offsets and lengths is checked by the server, which
    answers those with an error reply and keeps the connection.

    Raises:
        StorageProtocolError: Wrong magic, or a WRITE longer than :data:`MAX_PAYLOAD`
            (its payload cannot be skipped safely, so the connection must close).
    """
    if len(buf) != REQUEST_HEADER:
        raise StorageProtocolError("request header must be 28 bytes", got=len(buf))
    magic, flags, cmd, cookie, offset, length = _REQUEST.unpack(buf)
    if magic != REQUEST_MAGIC:
        raise StorageProtocolError("bad request magic", magic=hex(magic), cookie=cookie)
    if cmd == Cmd.WRITE and length > MAX_PAYLOAD:
        raise StorageProtocolError("write payload larger than 32 MiB", length=length, cookie=cookie)
    return Request(flags=flags, cmd=cmd, cookie=cookie, offset=offset, length=length)


def encode_request(req: Request) -> bytes:
    """Encode a request header (used by the test client)."""
    return _REQUEST.pack(REQUEST_MAGIC, req.flags, req.cmd, req.cookie, req.offset, req.length)


def simple_reply(cookie: int, error: int = 0) -> bytes:
    """A simple reply header; a successful READ's data follows it."""
    return _SIMPLE.pack(SIMPLE_REPLY_MAGIC, error, cookie)


def structured_data_header(cookie: int, offset: int, length: int) -> bytes:
    """Header of a final ``OFFSET_DATA`` chunk carrying ``length`` bytes read at ``offset``."""
    head = _STRUCTURED.pack(STRUCTURED_REPLY_MAGIC, _REPLY_FLAG_DONE, _REPLY_TYPE_OFFSET_DATA, cookie, 8 + length)
    return head + struct.pack(">Q", offset)


def structured_done(cookie: int) -> bytes:
    """A final ``NONE`` chunk: success without data."""
    return _STRUCTURED.pack(STRUCTURED_REPLY_MAGIC, _REPLY_FLAG_DONE, _REPLY_TYPE_NONE, cookie, 0)


def structured_error(cookie: int, error: int, message: str = "") -> bytes:
    """A final ``ERROR`` chunk carrying an errno and a human-readable message."""
    text = message.encode("utf-8")[:4096]
    payload = struct.pack(">IH", error, len(text)) + text
    head = _STRUCTURED.pack(STRUCTURED_REPLY_MAGIC, _REPLY_FLAG_DONE, _REPLY_TYPE_ERROR, cookie, len(payload))
    return head + payload
