"""Host-initiated gathers behind CamGather's post/wait: the host reads the ids, the engine gathers.

:meth:`HostGather.post` copies the row ids to the host (on CUDA this waits
for the current stream to reach them: call it on a stream that does not wait
for compute), checks them, and starts an ``IOEngine.gather`` into a block of
the engine's pinned staging arena. :meth:`HostGather.wait` blocks the host
until that gather is done, then enqueues the copy from staging into ``dest``
on the waiting stream and returns the block to the arena once the copy's
event has completed; nothing else synchronises the host with the GPU. At most
``slots`` requests read at once: ``post`` waits on the host for the read of
the request ``slots`` before it. With ``device="cpu"`` the copy is a plain one.

The rows reach ``dest`` only through :meth:`wait` (or :meth:`host_wait`): a
request that is never waited for is read and dropped.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from carina.core.errors import BackendUnavailable, IOEngineError
from carina.io._cam import CamConfig, CamTicket, check_request, dest_bytes, request_failed, row_offsets
from carina.io._future import IOFuture, OpKind, Request

if TYPE_CHECKING:
    from carina.io._engine import IOEngine
    from carina.io._handle import FileHandle

__all__ = ["HostGather"]


@dataclass(eq=False)
class _Pending:
    ticket: CamTicket
    future: IOFuture
    stage: Any  # uint8 CPU tensor, a block of the staging arena
    block: tuple[int, int] | None
    dest: Any  # uint8 view of the destination


class HostGather:
    """Rows of one file gathered at ids the host reads (see the module docstring).

    Args:
        engine: The engine that performs the reads (its staging arena holds the rows).
        handle: The file, opened for reading.
        config: Row size, most rows per request, requests reading at once (``slots``), device.

    Raises:
        BackendUnavailable: ``device`` is CUDA but no CUDA device is visible.
    """

    def __init__(self, engine: IOEngine, handle: FileHandle, config: CamConfig) -> None:
        import torch

        from carina.io._staging import _arena

        self.engine, self.handle, self.config = engine, handle, config
        self._cuda = config.device != "cpu"
        if self._cuda and not torch.cuda.is_available():
            raise BackendUnavailable(f"host-initiated gathers into {config.device} need a CUDA device: none visible")
        self._arena = _arena(engine)
        self._seq = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._copied: dict[int, tuple[int, Any]] = {}  # slot -> (seq, copy event) of its last request waited for
        self._lock = threading.Lock()
        self._closed = False
        self.stats = {"posted": 0, "served": 0}

    def post(self, ids: Any, dest: Any) -> CamTicket:
        """Ask for rows ``ids`` (1-D int64 tensor on the device) into ``dest`` (contiguous, same device).

        Raises:
            ConfigError: Bad ids or destination.
            IOEngineError: The gather is closed.
        """
        n = check_request(self.config, ids, dest)
        if self._closed:
            raise IOEngineError("HostGather is closed", path=str(self.handle.path))
        seq = next(self._seq)
        ticket = CamTicket(seq, seq % self.config.slots, n)
        older = self._pending.get(seq - self.config.slots)
        if older is not None:  # at most `slots` requests reading at once
            concurrent.futures.wait([older.future])
        host_ids = ids.cpu().numpy()  # the host needs the values: waits for the current stream on CUDA
        nbytes = n * self.config.row_bytes
        stage, block = self._arena.alloc(nbytes)
        try:
            offsets = row_offsets(host_ids, self.config.row_bytes, self.handle)
            future = self.engine.gather(self.handle, offsets, self.config.row_bytes, stage.numpy())
        except Exception as exc:  # noqa: BLE001 - a bad request fails its own ticket, at its wait
            future = IOFuture(Request(OpKind.READ, str(self.handle.path), 0, nbytes))
            future.set_running_or_notify_cancel()
            future.set_exception(exc)
        with self._lock:
            self._pending[seq] = _Pending(ticket, future, stage, block, dest_bytes(dest, nbytes))
            self.stats["posted"] += 1
        return ticket

    def wait(self, ticket: CamTicket, stream: Any = None) -> None:
        """Wait on the host for ``ticket``'s read, then copy its rows into ``dest`` on ``stream`` (default: current).

        A ticket waited for already returns at once (its copy is queued).

        Raises:
            IOEngineError: The read failed (naming the request; ``dest`` is untouched),
                or ``ticket`` was not posted here.
        """
        self._finish(ticket, stream, timeout=None)

    def host_wait(self, ticket: CamTicket, timeout: float | None = None) -> None:
        """Like :meth:`wait`, and block the host until the rows are in ``dest``.

        Raises:
            IOEngineError: As :meth:`wait`, or the read took longer than ``timeout`` seconds.
        """
        event = self._finish(ticket, None, timeout)
        if event is not None:
            event.synchronize()

    def _finish(self, ticket: CamTicket, stream: Any, timeout: float | None) -> Any:
        with self._lock:
            p = self._pending.pop(ticket.seq, None)
        if p is None:  # waited for already (its rows are copied or being copied), or never posted here
            if not 0 < ticket.seq <= self.stats["posted"]:
                raise IOEngineError(f"gather request {ticket.seq} was not posted here", path=str(self.handle.path))
            seq, event = self._copied.get(ticket.slot, (0, None))
            return event if seq == ticket.seq else None
        try:
            p.future.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending[ticket.seq] = p
            where = str(self.handle.path)
            raise IOEngineError(f"request {ticket.seq} not served within {timeout} s", path=where) from None
        except Exception as exc:  # re-raised naming the request
            self._arena.free(p.block)
            raise request_failed(ticket, self.handle, exc) from exc
        event = None
        if self._cuda:
            import torch

            stream = stream or torch.cuda.current_stream(self.config.device)
            with torch.cuda.stream(stream):
                p.dest.copy_(p.stage, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
        else:
            p.dest.copy_(p.stage)
        self._arena.free(p.block, after=event)
        with self._lock:
            self._copied[ticket.slot] = (ticket.seq, event)
            self.stats["served"] += 1
        return event

    def close(self, timeout: float = 60.0) -> None:
        """Let the reads in flight finish and give their staging back; refuse new requests (idempotent).

        Raises:
            IOEngineError: Reads were still in flight after ``timeout`` seconds.
        """
        self._closed = True
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        _, late = concurrent.futures.wait([p.future for p in pending], timeout)
        for p in pending:
            if p.future.done():
                self._arena.free(p.block)
        if late:
            raise IOEngineError(
                f"HostGather: {len(late)} reads not done within {timeout} s", path=str(self.handle.path)
            )

    def __enter__(self) -> HostGather:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
