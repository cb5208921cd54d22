"""The NBD front end: an asyncio ``BufferedProtocol`` per connection.

Headers are parsed on the event loop (the control path). A WRITE's payload is
received straight into a slot of the engine's arena (``get_buffer`` hands the
socket the slot's memoryview, so the kernel copies it there and nothing else
does). READ data is decompressed into a slot; the replies finished in one loop
turn leave in one ``writev`` straight from their slots (what the socket does
not take is copied to the transport), then their slots are released.
Requests run concurrently and reply out of order, as NBD allows. A frame the
protocol forbids raises :class:`~carina.core.errors.StorageProtocolError`,
which is logged and closes that connection only.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol, cast

from carina.core.errors import CarinaError, DeviceFull, StorageProtocolError
from carina.infra.storage import protocol as p
from carina.infra.storage.handshake import Handshake
from carina.infra.storage.stats import TierStats
from carina.infra.storage.tier import ReadResult, Tier, WriteLease

__all__ = ["NbdConnection"]

log = logging.getLogger("carina.infra.storage")

_STAGING = 256 << 10
_IOV_MAX = 512  # most buffers in one writev (Linux takes 1024)
_WRITEV_PIECE = 8 << 10  # mean piece size from which replies leave unjoined (small pieces: joining is cheaper)


class Listener(Protocol):
    """What a connection uses of its listener (:class:`~carina.infra.storage.listener.NbdServer`)."""

    tier: Tier
    stats: TierStats
    export: str
    connections: set[Any]
    accepted: int


class NbdConnection(asyncio.BufferedProtocol):
    """One client connection: handshake, then transmission."""

    def __init__(self, server: Listener) -> None:
        self.server = server
        self.tier: Tier = server.tier
        self.stats: TierStats = server.stats
        self._buf = bytearray(_STAGING)
        self._mv = memoryview(self._buf)
        self._start = self._end = 0
        self._need = 0
        self._on_bytes: Callable[[memoryview], None] | None = None
        self._target: WriteLease | None = None
        self._filled = 0
        self._pending_write: tuple[p.Request, int, float] | None = None
        self._direct = False
        self._blocked = False
        self._closed = False
        self._disconnecting = False
        self._writing_paused = False
        self._reading = True
        self._outbox: list[bytes | memoryview] = []
        self._after: list[Callable[[], None]] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.transport: asyncio.Transport | None = None
        self._fd = -1
        # asyncio.get_running_loop() makes a getpid() system call on every call (CPython 3.11): a few
        # microseconds each on a virtual machine, several per request; the connection keeps its loop.
        self._loop = asyncio.get_running_loop()
        self.handshake = Handshake(self, export=server.export, size=self.tier.size, block_size=self.tier.block_size)
        self.structured = False

    # -- asyncio callbacks -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.transport.set_write_buffer_limits(high=4 << 20)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        self.server.connections.add(self)
        self.server.accepted += 1
        self.stats.connections += 1
        self.handshake.start()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._closed = True
        self.server.connections.discard(self)
        self.stats.connections -= 1
        if self._target is not None:
            self.tier.drop(self._target)
            self._target = None
        self._flush()

    def pause_writing(self) -> None:  # noqa: D102
        self._writing_paused = True  # the client is not reading its replies: stop taking requests
        self._update_reading()

    def resume_writing(self) -> None:  # noqa: D102
        self._writing_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        want = not (self._blocked or self._writing_paused or self._disconnecting or self._closed)
        if want != self._reading and self.transport is not None and not self.transport.is_closing():
            self._reading = want
            (self.transport.resume_reading if want else self.transport.pause_reading)()

    def get_buffer(self, sizehint: int) -> memoryview:  # noqa: D102
        if self._target is not None and self._start == self._end:
            self._direct = True
            return self._target.buffer[self._filled :]
        self._direct = False
        if self._end == len(self._buf) or (
            self._start and len(self._buf) - self._end < p.OPTION_HEADER + p.MAX_OPTION_DATA
        ):
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start : self._end]
            self._start, self._end = 0, n
        return self._mv[self._end :]

    def buffer_updated(self, nbytes: int) -> None:  # noqa: D102
        if self._direct:
            self._filled += nbytes
            if self._target is not None and self._filled == len(self._target.buffer):
                self._payload_done()
        else:
            self._end += nbytes
        self._pump()

    def eof_received(self) -> bool | None:  # noqa: D102
        return None

    # -- framing ---------------------------------------------------------------------
    def expect(self, nbytes: int, callback: Callable[[memoryview], None]) -> None:
        """Call ``callback`` with the next ``nbytes`` bytes (a view valid during the call)."""
        self._need, self._on_bytes = nbytes, callback

    def _pump(self) -> None:
        try:
            while not self._blocked and not self._closed and not self._disconnecting:
                avail = self._end - self._start
                if self._target is not None:
                    want = len(self._target.buffer) - self._filled
                    k = min(avail, want)
                    if k == 0:
                        break
                    self._target.buffer[self._filled : self._filled + k] = self._mv[self._start : self._start + k]
                    self._start += k
                    self._filled += k
                    if self._filled == len(self._target.buffer):
                        self._payload_done()
                    continue
                if avail < self._need or self._on_bytes is None:
                    break
                view = self._mv[self._start : self._start + self._need]
                self._start += self._need
                self._on_bytes(view)
        except StorageProtocolError as exc:
            self.protocol_error(exc)
        if self._start == self._end:
            self._start = self._end = 0

    def protocol_error(self, exc: StorageProtocolError) -> None:
        """Log a protocol violation and close this connection (never the server)."""
        self.stats.protocol_errors += 1
        peer = self.transport.get_extra_info("peername") if self.transport else None
        log.error("closing NBD connection from %s: %s", peer, exc)
        self.close()

    def close(self) -> None:
        """Close the transport once queued replies are written."""
        self._flush()
        self._closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, *parts: bytes | memoryview, after: Callable[[], None] | None = None) -> None:
        """Queue reply bytes; every reply of one loop turn goes out in one write.

        ``after`` runs once the bytes are in the socket or copied to the
        transport (it releases the slot a READ reply was sent from).
        """
        self._outbox.extend(parts)
        if after is not None:
            self._after.append(after)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, after = self._outbox, self._after
        self._outbox, self._after = [], []
        t = self.transport
        if out and t is not None and not t.is_closing():
            total = sum(map(len, out))
            sent = self._write_now(out) if total >= len(out) * _WRITEV_PIECE and not t.get_write_buffer_size() else 0
            if not sent:
                t.write(b"".join(out))
            elif sent < total:  # the rest is copied, so the slots can go back now
                t.write(memoryview(b"".join(out))[sent:])
        for release in after:
            release()

    def _write_now(self, out: list[bytes | memoryview]) -> int:
        """Bytes of ``out`` the socket took in one ``writev`` (nothing queued in the transport: order holds).

        Replies leave from their slots without being joined into one buffer first (a 64 KiB copy per READ).
        """
        if self._fd < 0 or len(out) > _IOV_MAX:
            return 0
        try:
            return os.writev(self._fd, out)
        except OSError:  # EAGAIN, or a broken connection that the transport's own write then reports
            return 0

    # -- transmission ------------------------------------------------------------------
    def start_transmission(self) -> None:
        """Called by the handshake once an export is chosen."""
        self.expect(p.REQUEST_HEADER, self._on_request)

    def _on_request(self, view: memoryview) -> None:
        req = p.parse_request(view)
        if req.cmd == p.Cmd.DISC:
            self._disconnect()
            return
        error = self._invalid(req)
        if req.cmd == p.Cmd.WRITE:
            self._start_payload(req, error)
        elif error:
            self._reject(req, error, "unsupported command, bad flags or out of range")
        elif req.cmd == p.Cmd.READ:
            self._read_now(req)
        else:
            self._spawn(self._serve(req))

    def _read_now(self, req: p.Request) -> None:
        """Answer a READ before returning where the tier need not wait; otherwise in a task."""
        t0 = self._loop.time()
        try:
            result = self.tier.read_now(req.offset, req.length)
        except CarinaError as exc:
            self._fail(req, t0, exc)
            return
        if result is None:
            self._spawn(self._read(req, t0))
        else:
            self._reply_data(req, result, t0)

    def _invalid(self, req: p.Request) -> int:
        """The NBD errno a well-framed but unacceptable request gets (0 if acceptable)."""
        if req.cmd not in p.CMD_NAMES or req.flags & ~p.KNOWN_FLAGS:
            return p.Errno.EINVAL
        if req.cmd == p.Cmd.READ and req.length > p.MAX_PAYLOAD:
            return p.Errno.EOVERFLOW
        if req.cmd != p.Cmd.FLUSH and req.offset + req.length > self.tier.size:
            return p.Errno.ENOSPC if req.cmd in (p.Cmd.WRITE, p.Cmd.WRITE_ZEROES) else p.Errno.EINVAL
        return 0

    def _start_payload(self, req: p.Request, error: int) -> None:
        if error:  # the payload still has to be read off the wire, then dropped
            self._await_payload(req, WriteLease(req.offset, req.length, memoryview(bytearray(req.length)), None), error)
            return
        lease = self.tier.try_write_lease(req.offset, req.length)
        if lease is not None:
            self._await_payload(req, lease, 0)
            return
        self._blocked = True
        self._update_reading()
        self._spawn(self._wait_for_slot(req))

    async def _wait_for_slot(self, req: p.Request) -> None:
        lease = await self.tier.write_lease(req.offset, req.length)
        if self._closed:
            self.tier.drop(lease)
            return
        self._blocked = False
        self._await_payload(req, lease, 0)
        self._update_reading()
        self._pump()

    def _await_payload(self, req: p.Request, lease: WriteLease, error: int) -> None:
        self._target, self._filled = lease, 0
        self._pending_write = (req, error, self._loop.time())
        if not req.length:
            self._payload_done()

    def _payload_done(self) -> None:
        lease, self._target = self._target, None
        assert lease is not None and self._pending_write is not None
        req, error, t0 = self._pending_write
        if error:
            self._reject(req, error, "write outside the export")
        else:
            self._commit_now(req, lease, t0)
        self.expect(p.REQUEST_HEADER, self._on_request)

    def _commit_now(self, req: p.Request, lease: WriteLease, t0: float) -> None:
        """Commit and acknowledge a WRITE before returning where the tier need not wait; otherwise in a task."""
        fua = bool(req.flags & p.FUA_BIT)
        try:
            done = self.tier.commit_now(lease, fua=fua)
        except CarinaError as exc:
            self._fail(req, t0, exc)
            return
        if done:
            self._done(req, t0)
        else:
            self._spawn(self._run(req, t0, self.tier.commit(lease, fua=fua)))

    async def _serve(self, req: p.Request) -> None:
        t0 = self._loop.time()
        fua = bool(req.flags & p.FUA_BIT)
        if req.cmd == p.Cmd.READ:
            await self._read(req, t0)
        elif req.cmd == p.Cmd.FLUSH:
            await self._run(req, t0, self.tier.flush())
        elif req.cmd == p.Cmd.TRIM:
            await self._run(req, t0, self.tier.trim(req.offset, req.length))
        elif req.cmd == p.Cmd.WRITE_ZEROES:
            await self._run(req, t0, self.tier.write_zeroes(req.offset, req.length, fua=fua))
        else:  # CACHE: the data is already local
            await self._run(req, t0, _nothing())

    async def _run(self, req: p.Request, t0: float, work: Any) -> None:
        try:
            await work
        except CarinaError as exc:
            self._fail(req, t0, exc)
            return
        self._done(req, t0)

    def _done(self, req: p.Request, t0: float) -> None:
        self.send(p.structured_done(req.cookie) if self.structured else p.simple_reply(req.cookie))
        self._record(req, t0)

    async def _read(self, req: p.Request, t0: float) -> None:
        try:
            result = await self.tier.read(req.offset, req.length)
        except CarinaError as exc:
            self._fail(req, t0, exc)
            return
        self._reply_data(req, result, t0)

    def _reply_data(self, req: p.Request, result: ReadResult, t0: float) -> None:
        if self.structured:
            head = p.structured_data_header(req.cookie, req.offset, req.length)
        else:
            head = p.simple_reply(req.cookie)
        self.send(head, *result.buffers, after=result.release)
        self._record(req, t0)

    def _fail(self, req: p.Request, t0: float, exc: CarinaError) -> None:
        log.error("NBD %s at offset %d failed: %s", p.CMD_NAMES.get(req.cmd, "?"), req.offset, exc)
        self._reply_error(req, p.Errno.ENOSPC if isinstance(exc, DeviceFull) else p.Errno.EIO, str(exc))
        self._record(req, t0, ok=False)

    def _reply_error(self, req: p.Request, error: int, message: str) -> None:
        if self.structured:
            self.send(p.structured_error(req.cookie, error, message))
        else:
            self.send(p.simple_reply(req.cookie, error))

    def _reject(self, req: p.Request, error: int, message: str) -> None:
        """Answer a request the server will not run, keeping the connection."""
        log.warning("NBD request rejected (%s): cmd=%d offset=%d length=%d", message, req.cmd, req.offset, req.length)
        self._reply_error(req, error, message)
        self.stats.record(p.CMD_NAMES.get(req.cmd, "other"), 0, 0.0, ok=False)

    def _record(self, req: p.Request, t0: float, *, ok: bool = True) -> None:
        dt = self._loop.time() - t0
        self.stats.record(p.CMD_NAMES.get(req.cmd, "other"), req.length if ok else 0, dt, ok=ok)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("NBD request handler crashed", exc_info=task.exception())
        if self._disconnecting and not self._tasks:
            self.close()

    def _disconnect(self) -> None:
        self._disconnecting = True
        self._update_reading()
        if not self._tasks:
            self.close()


async def _nothing() -> None:
    return None
