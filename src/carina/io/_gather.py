"""Vectorised gathers: many rows of one file into one buffer, one future.

``IOEngine.gather(handle, offsets, nbytes, dest)`` reads row ``i`` (``nbytes``
bytes, or ``nbytes[i]``, at ``offsets[i]``) into ``dest`` packed in order. No
Python object is made per row: offsets, lengths and destination addresses are
NumPy arrays from validation to the backend, rows adjacent both in the file
and in ``dest`` are merged, and the ``uring`` backend writes all submission
entries of a batch with array stores. With O_DIRECT, unaligned rows are read
as aligned blocks into a bounce buffer and copied out with one NumPy gather.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from carina.core.errors import ConfigError, IOEngineError, ShortRead
from carina.io._buffers import address_of, byte_view, is_cuda_tensor
from carina.io._future import IOFuture, OpKind, Request

if TYPE_CHECKING:
    from carina.io._config import IOConfig
    from carina.io._handle import FileHandle

__all__ = ["GatherEngine", "GatherOp", "gather"]


@dataclass(eq=False)
class GatherOp:
    """Rows a backend reads: ``lengths[i]`` bytes at ``offsets[i]`` into ``view[positions[i]:]``.

    Backends fill :attr:`results` (bytes read, or ``-errno``) and then call
    :meth:`finish` exactly once.
    """

    fd: int
    offsets: np.ndarray  # int64
    lengths: np.ndarray  # int64
    positions: np.ndarray  # int64, into view
    view: memoryview
    on_done: Callable[[GatherOp], None]
    base: int = -1
    results: np.ndarray = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _left: int = field(init=False)

    def __post_init__(self) -> None:
        self.results = np.full(len(self.offsets), -1, dtype=np.int64)
        if self.base < 0:
            self.base = address_of(self.view)
        self._left = len(self.offsets)

    @property
    def addresses(self) -> np.ndarray:
        """Destination address of every row."""
        return self.positions.astype(np.uint64) + np.uint64(self.base)

    def rows_done(self, count: int) -> None:
        """Count ``count`` rows finished; the last one calls :meth:`finish`."""
        with self._lock:
            self._left -= count
            last = self._left == 0
        if last:
            self.finish()

    def finish(self) -> None:
        """Report completion (backends call this once, after every row's result is in)."""
        from carina.io._future import _CONTEXT

        before = getattr(_CONTEXT, "active", False)
        _CONTEXT.active = True
        try:
            self.on_done(self)
        finally:
            _CONTEXT.active = before


_NONE = np.zeros(0, dtype=np.int64)


def _as_rows(offsets: Any, nbytes: Any) -> tuple[np.ndarray, np.ndarray]:
    off = np.asarray(offsets)
    if off.ndim != 1 or off.dtype.kind not in "iu":
        raise ConfigError("offsets must be a 1-D integer array", key="offsets")
    off = off.astype(np.int64, copy=False)
    if isinstance(nbytes, int | np.integer) and not isinstance(nbytes, bool):
        if nbytes < 0:
            raise ConfigError("nbytes must be >= 0", key="nbytes")
        lengths = np.full(len(off), nbytes, dtype=np.int64)
    else:
        lengths = np.asarray(nbytes)
        if lengths.shape != off.shape or lengths.dtype.kind not in "iu":
            raise ConfigError("nbytes must be an integer or a 1-D integer array like offsets", key="nbytes")
        lengths = lengths.astype(np.int64, copy=False)
        if len(off) and lengths.min() < 0:
            raise ConfigError("nbytes must be >= 0", key="nbytes")
    if len(off) and off.min() < 0:
        raise ConfigError("offsets must be >= 0", key="offsets")
    return off, lengths


def _merge(off: np.ndarray, lengths: np.ndarray, pos: np.ndarray, limit: int) -> tuple[np.ndarray, ...]:
    """Merge consecutive rows adjacent in the file (their destinations are adjacent by construction)."""
    if len(off) < 2:
        return off, lengths, pos
    joins = off[1:] == off[:-1] + lengths[:-1]
    if not joins.any():
        return off, lengths, pos
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    run_len = np.add.reduceat(lengths, starts)
    if run_len.max(initial=0) > limit:  # keep runs bounded: split long ones back to rows
        return off, lengths, pos
    return off[starts], run_len, pos[starts]


class GatherEngine(Protocol):
    """What a gather uses of its engine (:class:`~carina.io.IOEngine`)."""

    @property
    def config(self) -> IOConfig:
        """The engine's config (``max_coalesce`` bounds merged rows)."""

    @property
    def stats(self) -> dict[str, int]:
        """The engine's counters (``requests``, ``merged``)."""

    def _check_handle(self, handle: FileHandle) -> None: ...

    def _run_gather(self, handle: FileHandle, op: GatherOp) -> None: ...

    def _bounce(self, nbytes: int) -> tuple[np.ndarray, Callable[[], None]]: ...

    def _gather_done(self, handle: FileHandle) -> None: ...


def gather(
    engine: GatherEngine, handle: FileHandle, offsets: Any, nbytes: Any, dest: Any, *, coalesce: bool = True
) -> IOFuture:
    """See :meth:`carina.io.IOEngine.gather`."""
    engine._check_handle(handle)
    if is_cuda_tensor(dest):
        raise ConfigError("gather into a GPU tensor: gather into pinned memory, then copy", key="dest")
    off, lengths = _as_rows(offsets, nbytes)
    view = byte_view(dest, writable=True)
    pos = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64) if len(off) else off
    total = int(lengths.sum())
    if total > view.nbytes:
        raise ConfigError(f"dest holds {view.nbytes} bytes, the rows need {total}", key="dest")
    future = IOFuture(Request(OpKind.READ, str(handle.path), int(off[0]) if len(off) else 0, total))
    future.set_running_or_notify_cancel()
    m_off, m_len, m_pos = _merge(off, lengths, pos, engine.config.max_coalesce) if coalesce else (off, lengths, pos)
    engine.stats["requests"] += len(off)
    engine.stats["merged"] += len(off) - len(m_off)
    align = handle.alignment
    base = address_of(view)
    aligned = handle.direct and base % align == 0 and not ((m_off | m_len | m_pos) & (align - 1)).any()
    if aligned or not handle.direct:
        finish = _finisher(engine, handle, future, m_off, m_len, None)
        op = GatherOp(handle.direct_fd if aligned else handle.fd, m_off, m_len, m_pos, view, finish, base)
    else:
        op = _bounced(engine, handle, future, m_off, m_len, m_pos, view)
    engine._run_gather(handle, op)
    return future


def _bounced(
    engine: GatherEngine,
    handle: FileHandle,
    future: IOFuture,
    off: np.ndarray,
    lengths: np.ndarray,
    pos: np.ndarray,
    view: memoryview,
) -> GatherOp:
    align = handle.alignment
    start = off - off % align
    cover = -(-(off + lengths) // align) * align - start
    bpos = np.concatenate(([0], np.cumsum(cover)[:-1])).astype(np.int64)
    bounce, give_back = engine._bounce(int(cover.sum()))
    copy = (bounce, bpos + (off - start), pos, view)
    finish = _finisher(engine, handle, future, off, lengths, copy, shift=off - start, give_back=give_back)
    return GatherOp(handle.direct_fd, start, cover, bpos, bounce.data, finish)


def _finisher(
    engine: GatherEngine,
    handle: FileHandle,
    future: IOFuture,
    off: np.ndarray,
    lengths: np.ndarray,
    copy: tuple[Any, ...] | None,
    shift: np.ndarray | None = None,
    give_back: Callable[[], None] | None = None,
) -> Callable[[GatherOp], None]:
    def done(op: GatherOp) -> None:
        try:
            useful = op.results if shift is None else op.results - shift
            short = useful < lengths  # failed rows (negative results) are short too
            bad = np.flatnonzero(short) if short.any() else _NONE
            if len(bad) and op.results[bad[0]] < 0:
                i = int(bad[0])
                err = -int(op.results[i])
                future.set_exception(
                    IOEngineError(
                        f"gather row failed: errno {err}",
                        path=str(handle.path),
                        offset=int(off[i]),
                        errno=err,
                        rows=len(bad),
                    )
                )
            elif len(bad):
                i = int(bad[0])
                future.set_exception(
                    ShortRead(
                        f"end of file in gather ({len(bad)} rows short)",
                        path=str(handle.path),
                        offset=int(off[i]),
                        expected=int(lengths[i]),
                        got=max(0, int(useful[i])),
                    )
                )
            else:
                if copy is not None:
                    _scatter_rows(copy[0], copy[1], copy[2], copy[3], lengths)
                future.set_result(int(lengths.sum()))
        finally:
            if give_back is not None:  # the rows are copied out (or failed): the bounce buffer is free
                give_back()
            engine._gather_done(handle)

    return done


def _scatter_rows(bounce: np.ndarray, src: np.ndarray, dst: np.ndarray, view: memoryview, lengths: np.ndarray) -> None:
    out = np.frombuffer(view, dtype=np.uint8)
    if len(lengths) and (lengths == lengths[0]).all() and lengths[0] > 0:
        width = int(lengths[0])
        windows = np.lib.stride_tricks.sliding_window_view(bounce, width)
        out[: width * len(src)].reshape(-1, width)[:] = windows[src]
        return
    for s, d, n in zip(src.tolist(), dst.tolist(), lengths.tolist(), strict=True):
        out[d : d + n] = bounce[s : s + n]
