"""The fixed-newstyle NBD handshake: option haggling until ``GO`` or ``EXPORT_NAME``.

Option data that is malformed but framed correctly gets an ``NBD_REP_ERR_*``
reply with a message and the haggling goes on; a broken frame (wrong magic,
oversized option, unknown client flags) ends the connection.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Protocol

from carina.core.errors import StorageProtocolError
from carina.infra.storage import protocol as p

__all__ = ["Handshake", "NbdPeer"]

log = logging.getLogger("carina.infra.storage")


class NbdPeer(Protocol):
    """What the handshake uses of its connection (:class:`~carina.infra.storage.server.NbdConnection`)."""

    structured: bool

    def send(self, *parts: bytes | memoryview) -> None:
        """Queue reply bytes."""

    def expect(self, nbytes: int, callback: Callable[[memoryview], None]) -> None:
        """Call ``callback`` with the next ``nbytes`` bytes."""

    def start_transmission(self) -> None:
        """Go on to transmission (an export is chosen)."""

    def close(self) -> None:
        """Close the connection."""


class Handshake:
    """Drives one connection from the greeting to transmission.

    Args:
        conn: The connection.
        export: The name of the one export served.
        size: Its size in bytes.
        block_size: Its preferred block size.
    """

    def __init__(self, conn: NbdPeer, *, export: str, size: int, block_size: int) -> None:
        self.conn = conn
        self.export, self.size, self.block_size = export, size, block_size
        self.no_zeroes = False

    def start(self) -> None:
        """Send the greeting and wait for the client's flags."""
        self.conn.send(p.greeting())
        self.conn.expect(4, self._on_client_flags)

    def _on_client_flags(self, view: memoryview) -> None:
        flags = p.parse_client_flags(view)
        self.no_zeroes = bool(flags & p.HandshakeFlag.NO_ZEROES)
        self.conn.expect(p.OPTION_HEADER, self._on_header)

    def _on_header(self, view: memoryview) -> None:
        head = p.parse_option_header(view)
        if head.length:
            self.conn.expect(head.length, lambda data: self._on_option(head.option, bytes(data)))
        else:
            self._on_option(head.option, b"")

    def _next(self) -> None:
        self.conn.expect(p.OPTION_HEADER, self._on_header)

    def _reply(self, option: int, rtype: int, data: bytes = b"") -> None:
        self.conn.send(p.option_reply(option, rtype, data))

    def _error(self, option: int, rtype: p.Rep, message: str) -> None:
        log.info("NBD option %d refused: %s", option, message)
        self._reply(option, rtype, message.encode())
        self._next()

    def _on_option(self, option: int, data: bytes) -> None:
        handlers = {
            p.Opt.EXPORT_NAME: self._export_name,
            p.Opt.ABORT: self._abort,
            p.Opt.LIST: self._list,
            p.Opt.INFO: self._info,
            p.Opt.GO: self._info,
            p.Opt.STRUCTURED_REPLY: self._structured,
            p.Opt.LIST_META_CONTEXT: self._meta_context,
            p.Opt.SET_META_CONTEXT: self._meta_context,
        }
        handler = handlers.get(option)  # type: ignore[call-overload]
        if handler is None:
            self._error(option, p.Rep.ERR_UNSUP, f"option {option} is not supported")
            return
        handler(option, data)

    def _export_name(self, option: int, data: bytes) -> None:
        name = data.decode("utf-8", errors="replace")
        if name not in (self.export, ""):
            raise StorageProtocolError("client asked for an unknown export", export=name)
        self.conn.send(p.export_name_reply(self.size, p.TRANSMISSION_FLAGS, no_zeroes=self.no_zeroes))
        self.conn.start_transmission()

    def _abort(self, option: int, data: bytes) -> None:
        self._reply(option, p.Rep.ACK)
        self.conn.close()

    def _list(self, option: int, data: bytes) -> None:
        if data:
            self._error(option, p.Rep.ERR_INVALID, "NBD_OPT_LIST takes no data")
            return
        name = self.export.encode()
        self._reply(option, p.Rep.SERVER, struct.pack(">I", len(name)) + name)
        self._reply(option, p.Rep.ACK)
        self._next()

    def _info(self, option: int, data: bytes) -> None:
        try:
            req = p.parse_export_request(data)
        except StorageProtocolError as exc:
            self._error(option, p.Rep.ERR_INVALID, exc.message)
            return
        if req.name not in (self.export, ""):
            self._error(option, p.Rep.ERR_UNKNOWN, f"no export named {req.name!r}")
            return
        self._reply(option, p.Rep.INFO, p.info_export(self.size, p.TRANSMISSION_FLAGS))
        if p.Info.NAME in req.infos:
            self._reply(option, p.Rep.INFO, p.info_name(self.export))
        self._reply(option, p.Rep.INFO, p.info_block_size(1, self.block_size, p.MAX_PAYLOAD))
        self._reply(option, p.Rep.ACK)
        if option == p.Opt.GO:
            self.conn.start_transmission()
        else:
            self._next()

    def _structured(self, option: int, data: bytes) -> None:
        if data:
            self._error(option, p.Rep.ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data")
            return
        self.conn.structured = True
        self._reply(option, p.Rep.ACK)
        self._next()

    def _meta_context(self, option: int, data: bytes) -> None:
        if not self.conn.structured:
            self._error(option, p.Rep.ERR_INVALID, "meta contexts need structured replies first")
            return
        self._reply(option, p.Rep.ACK)  # no metadata contexts are offered
        self._next()
