"""GPU-initiated gathers (CAM's request path): the GPU posts row ids, a CPU manager serves them.

GPU code computes which rows of a file it needs (a tensor of row ids on the
device) and calls :meth:`CamGather.post`. Nothing waits on the host: on the
caller's CUDA stream the ids are copied into a slot of a pinned, device-mapped
request ring, then ``cuStreamWriteValue32`` rings that slot's doorbell (a
32-bit sequence number in the same mapped memory). A manager thread polls the
doorbells, serves every posted slot it finds in one pass (each becomes an
``IOEngine.gather`` into the slot's pinned staging buffer, so the backend
submits them together), copies the rows to the destination on a copy stream,
and makes that stream store the sequence number into the slot's completion
word. :meth:`CamGather.wait` makes a stream wait on that word with
``cuStreamWaitValue32``: compute code stays straight-line and the host never
synchronises with the GPU in the loop.

With ``device="cpu"`` the same ring, manager and engine run with host stores
and host waits in place of the stream operations (how CI tests it).

Two rules keep the ring free of deadlocks on CUDA. Completion words are
written in sequence order, whatever order the reads finish in: the copy
stream is shared, and a later request's copy waits (on the device) for the
caller's stream to pass that request's post, which may sit behind a stream
wait for an earlier request; queued first, the later copy would block the
earlier one's completion word forever. And the threads that serve requests
allocate no CUDA or pinned memory while a stream may be waiting (the
engine's pinned staging arena, which a gather of rows not aligned for
``O_DIRECT`` bounces through, is made when the gather is).

Limits: one sequence counter of 31 bits per instance; a request's row count
is known on the host when it is posted (the ids' values are not); the
destination must stay untouched by other streams until :meth:`wait`. The
copy stream comes from PyTorch's pool of high-priority streams, apart from
the ordinary streams callers make; :meth:`wait` refuses to make the copy
stream itself wait (it would wait ahead of the copy that releases it).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from carina.core.errors import BackendUnavailable, ConfigError, IOEngineError

if TYPE_CHECKING:
    from carina.io._engine import IOEngine
    from carina.io._handle import FileHandle

__all__ = ["CamConfig", "CamGather", "CamTicket", "check_request", "request_failed", "row_offsets"]

_ALIGN = 4096


@dataclass(kw_only=True)
class CamConfig:
    """Settings of a :class:`CamGather`.

    Attributes:
        row_bytes: Bytes per row; row ``i`` lives at file offset ``i * row_bytes``.
        max_rows: Most rows one request may ask for.
        slots: Requests in flight at once (ring slots; each has its own staging buffer).
        device: ``"cuda"`` (stream memory operations) or ``"cpu"`` (host stores and waits).
        poll_s: Manager's sleep between doorbell scans while requests are outstanding.
    """

    row_bytes: int
    max_rows: int
    slots: int = 4
    device: str = "cuda"
    poll_s: float = 20e-6

    def __post_init__(self) -> None:
        for key in ("row_bytes", "max_rows", "slots"):
            if int(getattr(self, key)) <= 0:
                raise ConfigError(f"{key} must be > 0", key=key, value=getattr(self, key))
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError("device must be 'cpu' or 'cuda[:N]'", key="device", value=self.device)
        if self.poll_s < 0:
            raise ConfigError("poll_s must be >= 0", key="poll_s", value=self.poll_s)


@dataclass(frozen=True)
class CamTicket:
    """One posted request: its sequence number, ring slot and row count."""

    seq: int
    slot: int
    rows: int


@dataclass(eq=False)
class _Posted:
    ticket: CamTicket
    dest: Any  # uint8 view of the destination
    event: Any  # CUDA event recorded after the post (the copy waits on it), or None


class CamGather:
    """Rows of one file gathered on requests posted by GPU code (see the module docstring).

    Args:
        engine: The engine that performs the reads.
        handle: The file, opened for reading.
        config: Row size, ring size, device.

    Raises:
        BackendUnavailable: ``device`` is CUDA but stream memory operations are not available.
    """

    def __init__(self, engine: IOEngine, handle: FileHandle, config: CamConfig) -> None:
        import torch

        self.engine, self.handle, self.config = engine, handle, config
        self._cuda = config.device != "cpu"
        if self._cuda:
            from carina.io._memops import memops_unavailable_reason

            why = memops_unavailable_reason()
            if why:
                raise BackendUnavailable(f"GPU-initiated gathers need CUDA stream memory operations: {why}")
        pin = self._cuda
        stride = -(-config.max_rows * config.row_bytes // _ALIGN) * _ALIGN
        self._stride = stride
        self._flags = torch.zeros(2, config.slots, dtype=torch.int32, pin_memory=pin)  # posted, done
        self._ids = torch.zeros(config.slots, config.max_rows, dtype=torch.int64, pin_memory=pin)
        raw = torch.empty(config.slots * stride + _ALIGN, dtype=torch.uint8, pin_memory=pin)
        shift = (-raw.data_ptr()) % _ALIGN
        self._staging = raw[shift : shift + config.slots * stride]
        self._posted_np, self._done_np = self._flags.numpy()[0], self._flags.numpy()[1]
        self._ids_np, self._staging_np = self._ids.numpy(), self._staging.numpy()
        self._copy_done: list[Any] = [None] * config.slots
        self._pending: dict[int, _Posted] = {}
        self._finished: dict[int, tuple[_Posted, BaseException | None]] = {}  # read, its completion not yet written
        self._next_done = 1  # the sequence number whose completion is written next
        self._order = threading.Lock()
        self._errors: dict[int, BaseException] = {}
        self._seq = itertools.count(1)
        self._cond = threading.Condition()
        self._closing = self._stopped = False
        self.stats = {"posted": 0, "served": 0, "passes": 0, "max_per_pass": 0}
        if self._cuda:
            self._setup_cuda(torch)
        self._thread = threading.Thread(target=self._manage, name="carina-io-cam", daemon=True)
        self._thread.start()

    def _setup_cuda(self, torch: Any) -> None:
        from carina.io._memops import MemOps
        from carina.io._staging import _arena

        _arena(self.engine)  # pinned bounce memory now, never on the manager thread while a stream waits

        self._ops = MemOps()
        self._posted_dev = self._ops.device_pointer(self._flags.data_ptr())
        self._done_dev = self._posted_dev + 4 * self.config.slots
        # High priority: a pool apart from the ordinary streams (32 per priority, handed out in turn), so a
        # caller's stream is never this one unless drawn from the high-priority pool too (wait checks).
        self._copy_stream = torch.cuda.Stream(device=self.config.device, priority=-1)
        probe = torch.zeros(8, dtype=torch.uint8, device=self.config.device)  # load the copy paths once
        probe.copy_(self._staging[:8], non_blocking=True)
        self._staging[:8].copy_(probe, non_blocking=True)
        torch.cuda.synchronize(self.config.device)

    # -- caller side ------------------------------------------------------------------
    def post(self, ids: Any, dest: Any) -> CamTicket:
        """Ask for rows ``ids`` (1-D int64 tensor on the device) into ``dest`` (contiguous, same device).

        On CUDA this only enqueues work on the current stream (the host blocks
        only while every ring slot is still in use).

        Raises:
            ConfigError: Bad ids or destination.
            IOEngineError: The gather is closed.
        """
        import torch

        n = check_request(self.config, ids, dest)
        if self._closing:
            raise IOEngineError("CamGather is closed", path=str(self.handle.path))
        seq = next(self._seq)
        if seq >= 1 << 31:
            raise IOEngineError("CamGather sequence numbers exhausted (2^31 requests)", path=str(self.handle.path))
        slot = seq % self.config.slots
        self._wait_done(slot, seq - self.config.slots, timeout=None)  # the slot's last request is served
        ticket = CamTicket(seq, slot, n)
        view = dest_bytes(dest, n * self.config.row_bytes)
        event = None
        if self._cuda:
            stream = torch.cuda.current_stream(self.config.device)
            self._ids[slot, :n].copy_(ids, non_blocking=True)  # D2H in stream order
            self._ops.write(stream.cuda_stream, self._posted_dev + 4 * slot, seq)  # the doorbell
            event = torch.cuda.Event()
            event.record(stream)
        with self._cond:
            self._pending[seq] = _Posted(ticket, view, event)
            if not self._cuda:
                self._ids[slot, :n].copy_(ids)
                self._posted_np[slot] = seq
            self.stats["posted"] += 1
            self._cond.notify_all()
        return ticket

    def wait(self, ticket: CamTicket, stream: Any = None) -> None:
        """Make ``stream`` (default: current) wait for ``ticket``'s rows; on CPU the host waits."""
        if not self._cuda:
            self.host_wait(ticket)
            return
        import torch

        stream = stream or torch.cuda.current_stream(self.config.device)
        if stream.cuda_stream == self._copy_stream.cuda_stream:
            raise ConfigError(
                "the waiting stream is CamGather's copy stream (a pooled high-priority stream): it would wait "
                "ahead of the copy that releases it; wait on another stream",
                key="stream",
            )
        self._ops.wait_geq(stream.cuda_stream, self._done_dev + 4 * ticket.slot, ticket.seq)

    def host_wait(self, ticket: CamTicket, timeout: float | None = None) -> None:
        """Block the host until ``ticket`` is served; raise its error if its read failed.

        Raises:
            IOEngineError: The read failed (the rows in ``dest`` are undefined), or timeout.
        """
        self._wait_done(ticket.slot, ticket.seq, timeout)
        error = self._errors.pop(ticket.seq, None)
        if error is not None:
            raise request_failed(ticket, self.handle, error)

    def _wait_done(self, slot: int, seq: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while int(self._done_np[slot]) < seq:
            if deadline is not None and time.monotonic() > deadline:
                raise IOEngineError(f"request {seq} not served within {timeout} s", path=str(self.handle.path))
            if not self._thread.is_alive():
                raise IOEngineError("CamGather manager thread stopped", path=str(self.handle.path))
            with self._cond:
                self._cond.wait(self.config.poll_s if self._cuda else 0.05)

    # -- manager thread ---------------------------------------------------------------
    def _manage(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending and self._closing:
                    return
                ready = [p for seq, p in self._pending.items() if int(self._posted_np[p.ticket.slot]) >= seq]
                for p in ready:
                    del self._pending[p.ticket.seq]
            if not ready:
                time.sleep(self.config.poll_s)
                continue
            self.stats["passes"] += 1
            self.stats["max_per_pass"] = max(self.stats["max_per_pass"], len(ready))
            for p in ready:
                self._serve(p)

    def _serve(self, p: _Posted) -> None:
        t = p.ticket
        done = self._copy_done[t.slot]
        if done is not None:
            done.synchronize()  # the slot's previous rows have left its staging buffer
        rb = self.config.row_bytes
        staging = self._staging_np[t.slot * self._stride : t.slot * self._stride + t.rows * rb]
        try:
            offsets = row_offsets(self._ids_np[t.slot, : t.rows], rb, self.handle)
            fut = self.engine.gather(self.handle, offsets, rb, staging)
        except Exception as exc:  # noqa: BLE001 - a bad request fails its own ticket, never the manager
            self._finish(p, exc)
            return
        fut.add_done_callback(lambda f: self._finish(p, f.exception()))

    def _finish(self, p: _Posted, error: BaseException | None) -> None:
        """Record ``p``'s outcome; write the completions that are now next in sequence order."""
        with self._order:
            self._finished[p.ticket.seq] = (p, error)
            while self._next_done in self._finished:
                self._complete(*self._finished.pop(self._next_done))
                self._next_done += 1

    def _complete(self, p: _Posted, error: BaseException | None) -> None:
        t = p.ticket
        if error is not None:
            self._errors[t.seq] = error
        if self._cuda:
            import torch

            rows = self._staging[t.slot * self._stride : t.slot * self._stride + t.rows * self.config.row_bytes]
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(p.event)  # the caller's stream is past the post
                if error is None:
                    p.dest.copy_(rows, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._copy_stream)
                self._copy_done[t.slot] = event
                self._ops.write(self._copy_stream.cuda_stream, self._done_dev + 4 * t.slot, t.seq)
        else:
            if error is None:
                p.dest.copy_(self._staging[t.slot * self._stride :][: t.rows * self.config.row_bytes])
            self._done_np[t.slot] = t.seq
        with self._cond:
            self.stats["served"] += 1
            self._cond.notify_all()

    # -- lifecycle --------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> None:
        """Serve what was posted, then stop the manager (GPU work that posts must be able to run).

        Raises:
            IOEngineError: Posted requests were not served within ``timeout`` seconds.
        """
        if self._stopped:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        with self._cond:  # every served request's rows copied and its completion word written
            while self.stats["served"] < self.stats["posted"] and time.monotonic() < deadline:
                self._cond.wait(0.01)
        if self._thread.is_alive() or self.stats["served"] < self.stats["posted"]:
            raise IOEngineError(f"CamGather: posted requests not served within {timeout} s", path=str(self.handle.path))
        if self._cuda:
            self._copy_stream.synchronize()
        self._stopped = True

    def __enter__(self) -> CamGather:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_request(config: CamConfig, ids: Any, dest: Any) -> int:
    """Validate one request of a row gather (either path); return its row count.

    Raises:
        ConfigError: ``ids`` is not a 1-D int64 tensor of 1 to ``max_rows`` rows on
            ``config.device``, or ``dest`` is not a contiguous tensor there that holds the rows.
    """
    import torch

    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
        raise ConfigError("ids must be a 1-D int64 tensor", key="ids")
    n = int(ids.numel())
    if not 0 < n <= config.max_rows:
        raise ConfigError(f"ids holds {n} rows; 1 to {config.max_rows} allowed", key="ids")
    want = torch.device(config.device).type
    if ids.device.type != want or not isinstance(dest, torch.Tensor) or dest.device.type != want:
        raise ConfigError(f"ids and dest must be on {config.device}", key="dest")
    if not dest.is_contiguous() or dest.numel() * dest.element_size() < n * config.row_bytes:
        raise ConfigError(f"dest must be contiguous and hold {n * config.row_bytes} bytes", key="dest")
    return n


def dest_bytes(dest: Any, nbytes: int) -> Any:
    """The first ``nbytes`` of a contiguous tensor, as a flat ``uint8`` view."""
    import torch

    return dest.reshape(-1).view(torch.uint8)[:nbytes]


def row_offsets(ids: np.ndarray, row_bytes: int, handle: FileHandle) -> np.ndarray:
    """File offsets of rows ``ids`` (host values).

    Raises:
        IOEngineError: A row lies outside the file (naming the first such offset).
    """
    offsets = ids.astype(np.int64, copy=False) * row_bytes
    bad = (offsets < 0) | (offsets + row_bytes > handle.size)
    if bad.any():
        where = int(offsets[np.flatnonzero(bad)[0]])
        raise IOEngineError("row id outside the file", path=str(handle.path), offset=where)
    return offsets


def request_failed(ticket: CamTicket, handle: FileHandle, error: BaseException) -> IOEngineError:
    """The error a failed request raises at its wait: the request named, the cause's class and context kept."""
    context = {"path": str(handle.path), **getattr(error, "context", {})}
    cls = type(error) if isinstance(error, IOEngineError) else IOEngineError
    message = getattr(error, "message", None) or str(error)
    return cls(f"gather request {ticket.seq} ({ticket.rows} rows) failed: {message}", **context)


def reference_rows(path: str, ids: np.ndarray, row_bytes: int) -> np.ndarray:
    """The bytes of rows ``ids`` read with plain ``numpy.fromfile`` (for checks)."""
    with open(path, "rb") as f:
        out = []
        for i in ids.tolist():
            f.seek(i * row_bytes)
            out.append(np.frombuffer(f.read(row_bytes), dtype=np.uint8))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint8)
