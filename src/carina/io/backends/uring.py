"""The ``uring`` backend: io_uring through raw system calls, one ring thread.

Callers append work to a queue and, if the ring thread sleeps in the kernel,
poke an eventfd (a read of it stays queued in the ring). The ring thread turns
as much queued work as there are free slots into submission entries, submits
them all with one ``io_uring_enter`` (which also waits for a completion, the
GIL released), then, as soon as completions are in, refills the freed slots
and submits again before it does the bookkeeping of what completed. A slot of
the queue depth is one op, or one linked chain (``IOSQE_IO_LINK``) of up to 16
rows of a gather: the kernel issues a chain's next read the moment its last
one completes, so ``queue_depth`` reads stay in flight however late this
thread (one Python thread, on a busy core) turns round. A gather's entries are
built in the caller's thread and copied into the ring with array stores; its
completions are reaped with array loads: no Python object per row. Nothing is
compiled; the kernel only needs io_uring enabled.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from carina.io._buffers import address_of
from carina.io._future import Op, OpKind
from carina.io._gather import GatherOp
from carina.io.backends._ring import OP_READ, OP_READ_FIXED, OP_READV, OP_WRITE, OP_WRITE_FIXED, OP_WRITEV, Ring
from carina.io.backends.base import IOBackend

__all__ = ["UringBackend"]

log = logging.getLogger("carina.io")

_WAKE = 1 << 62
_ROW = 1 << 61  # user_data of a gather row: _ROW | [_TAIL] | gather id << 32 | row
_TAIL = 1 << 60  # the row ends its chain: its completion frees a slot of the queue depth
_GID = 0x0FFFFFFF  # gather ids: 28 bits
_ROW_HIGH, _WAKE_HIGH, _TAIL_HIGH = _ROW >> 32, _WAKE >> 32, _TAIL >> 32
_LINK = np.uint64(4 << 8)  # IOSQE_IO_LINK in the entry's first word (flags byte)
_CHAIN = 16  # most rows in one linked chain


class UringBackend(IOBackend):
    """io_uring backend: at most ``queue_depth`` reads at the device (ops or chains of rows), batched submission."""

    name: ClassVar[str] = "uring"
    capabilities: ClassVar[frozenset[str]] = frozenset({"vectored", "async", "real_io", "batched_submit"})

    def __init__(self, *, queue_depth: int = 64, workers: int = 0) -> None:
        super().__init__(queue_depth=queue_depth, workers=workers)
        # A gather's rows go in as linked chains (IOSQE_IO_LINK) of up to `_chain` rows: the kernel issues a
        # chain's next read the moment the last one completes, so queue_depth reads stay in flight however late
        # this thread turns round. The ring holds every entry of queue_depth chains, plus one that wakes us.
        self._chain = max(1, min(_CHAIN, 16384 // queue_depth))
        self._ring = Ring(min(32768, 1 << (queue_depth * self._chain + 1).bit_length()))
        self._room = self._capacity = queue_depth  # chains and single ops in flight at most
        self._queue: collections.deque[Op | list[Any]] = collections.deque()
        self._ops: dict[int, tuple[Op, Any]] = {}
        self._gathers: dict[int, GatherOp] = {}
        self._parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # completions of unfinished gathers
        self._ids = itertools.count()
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC)
        self._wake_buf = ctypes.create_string_buffer(8)
        self._stopping = self._sleeping = False
        self._fixed: tuple[int, int] | None = None  # registered [start, end)
        self.fixed_ops = 0
        self._thread = threading.Thread(target=self._loop, name="carina-io-uring", daemon=True)
        self._thread.start()

    @classmethod
    def probe_reasons(cls) -> list[str]:
        """io_uring must be allowed by the kernel (checked with a real ``io_uring_setup``)."""
        from carina.core.probes import probe_io_uring

        if not hasattr(os, "eventfd"):
            return ["os.eventfd is missing (Python >= 3.10 on Linux needed)"]
        ok, why = probe_io_uring()
        return [] if ok else [why]

    def register_memory(self, address: int, length: int) -> bool:
        """Register one region as an io_uring fixed buffer; ops inside it use READ/WRITE_FIXED."""
        if self._fixed is not None or length <= 0:
            return False
        try:
            self._ring.register_buffers([(address, length)])
        except OSError as exc:  # e.g. RLIMIT_MEMLOCK too low: plain reads still work
            log.warning("carina.io: io_uring buffer registration refused: %s", exc)
            return False
        self._fixed = (address, address + length)
        return True

    def _submit(self, ops: Sequence[Op]) -> None:
        self._queue.extend(ops)
        self._poke()

    def _submit_gather(self, gather: GatherOp) -> None:
        # The caller's thread names the gather and builds all its ring entries, so the ring thread only copies.
        gid = next(self._ids) & _GID
        users = np.uint64(_ROW | gid << 32) | np.arange(len(gather.offsets), dtype=np.uint64)
        entries = Ring.entries(OP_READ, gather.fd, gather.offsets, gather.addresses, gather.lengths, users)
        self._gathers[gid] = gather
        self._queue.append([gather, 0, entries])  # [gather, next row, its entries]
        self._poke()

    def _poke(self) -> None:
        if self._sleeping:  # the ring thread may be waiting in the kernel: wake it
            os.eventfd_write(self._wake_fd, 1)

    def _close(self) -> None:
        self._stopping = True
        os.eventfd_write(self._wake_fd, 1)
        self._thread.join()
        self._ring.close()
        os.close(self._wake_fd)

    # -- ring thread -----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._turn()
        except BaseException as exc:  # a bug or a dead ring: fail what is pending, never hang callers
            self._fail_all(exc)
            raise

    def _fail_all(self, exc: BaseException) -> None:
        self.closed = True
        error = OSError(5, f"uring backend stopped: {exc!r}")
        for op, _ in self._ops.values():
            op.finish(error)
        for gather in list(self._gathers.values()):  # every gather submitted and not finished, queued or not
            gather.results[gather.results < 0] = -5
            gather.finish()
        for item in self._queue:
            if isinstance(item, Op):
                item.finish(error)

    def _turn(self) -> None:
        self._arm_wake()
        while True:
            self._fill()
            if self._stopping and not self._queue and self._room == self._capacity:
                return
            self._sleeping = True
            self._ring.enter(wait=0 if self._queue and self._room else 1)  # re-check after announcing
            self._sleeping = False
            user, res = self._ring.completion_arrays()
            if not len(user):
                continue
            # Refill first, account after: a device that returns a submitted batch all at once is idle from
            # its last completion until the next submission, so only the ring stores sit in between.
            self._room += int(np.count_nonzero(user & np.uint64(_TAIL)))  # chains that ended
            if int(user.min()) < _ROW:  # single ops (the eventfd read is above _ROW, holds no room)
                self._room += int(np.count_nonzero(user < np.uint64(_ROW)))
            if self._queue:
                self._fill()
                self._ring.enter(wait=0)
            self._reap(user, res)

    def _arm_wake(self) -> None:
        self._ring.prepare(OP_READ, self._wake_fd, 0, ctypes.addressof(self._wake_buf), 8, _WAKE)

    def _fill(self) -> None:
        while self._queue and self._room:
            item = self._queue[0]
            if isinstance(item, Op):
                self._queue.popleft()
                self._prepare_op(item)
                self._room -= 1
                continue
            _, row, entries = item
            chains = min(self._room, len(entries) - row)
            length = min(self._chain, (len(entries) - row) // chains)
            end = row + chains * length
            self._ring.put(_chained(entries[row:end], chains, length))
            self._room -= chains
            item[1] = end
            if end == len(entries):
                self._queue.popleft()

    def _prepare_op(self, op: Op) -> None:
        keep: Any = None
        if len(op.views) == 1:
            view = op.views[0]
            code, addr, length = (OP_READ if op.kind is OpKind.READ else OP_WRITE), address_of(view), view.nbytes
            fixed = self._fixed
            if fixed is not None and fixed[0] <= addr and addr + length <= fixed[1]:
                code = OP_READ_FIXED if op.kind is OpKind.READ else OP_WRITE_FIXED
                self.fixed_ops += 1
        else:
            keep = (ctypes.c_uint64 * (2 * len(op.views)))(*[x for v in op.views for x in (address_of(v), v.nbytes)])
            code = OP_READV if op.kind is OpKind.READ else OP_WRITEV
            addr, length = ctypes.addressof(keep), len(op.views)
        slot = id(op) & 0xFFFFFFFFFFFF  # below the gather and wake bits; unique while op is alive
        self._ops[slot] = (op, keep)
        self._ring.prepare(code, op.fd, op.offset, addr, length, slot)

    def _reap(self, user: np.ndarray, res: np.ndarray) -> None:
        """Finish what completed (the ring's room for it was given back already)."""
        high = (user >> np.uint64(32)) | np.uint64(_TAIL_HIGH)
        first = int(high[0])
        if first & _ROW_HIGH and not first & _WAKE_HIGH and (high == first).all():  # the common case
            self._rows_of(first & _GID, user, res)
            return
        rows = (user & np.uint64(_ROW | _WAKE)) == np.uint64(_ROW)
        for u, r in zip(user[~rows].tolist(), res[~rows].tolist(), strict=True):
            if u == _WAKE:
                self._arm_wake()
                continue
            op, _ = self._ops.pop(u)
            op.finish(r if r >= 0 else OSError(-r, os.strerror(-r)))
        if rows.any():
            self._reap_rows(user[rows], res[rows])

    def _reap_rows(self, user: np.ndarray, res: np.ndarray) -> None:
        gids = ((user >> np.uint64(32)) & np.uint64(_GID)).astype(np.int64)
        for gid in np.unique(gids).tolist():
            mine = gids == gid
            self._rows_of(gid, user[mine], res[mine])

    def _rows_of(self, gid: int, user: np.ndarray, res: np.ndarray) -> None:
        """Completions of rows of one gather; results are scattered once, when its last row is in."""
        gather = self._gathers[gid]
        parts = self._parts.setdefault(gid, [])
        parts.append((user, res))
        if gather._left == len(user):
            del self._gathers[gid], self._parts[gid]
            users = parts[0][0] if len(parts) == 1 else np.concatenate([u for u, _ in parts])
            results = parts[0][1] if len(parts) == 1 else np.concatenate([r for _, r in parts])
            gather.results[users & np.uint64(0xFFFFFFFF)] = results
        gather.rows_done(len(user))


def _chained(entries: np.ndarray, chains: int, length: int) -> np.ndarray:
    """``chains * length`` ring entries (rows in order) laid out as ``chains`` linked chains of ``length``.

    Chain ``j`` reads rows ``j, j + chains, ...``, so every chain moves through the gather at the same pace;
    all entries but a chain's last carry ``IOSQE_IO_LINK``, the last carries ``_TAIL`` in its user data.
    """
    block = entries.reshape(length, chains, 8).transpose(1, 0, 2).reshape(chains * length, 8)  # a copy
    if length > 1:
        block[:, 0] |= _LINK
        block[length - 1 :: length, 0] &= ~_LINK
    block[length - 1 :: length, 4] |= np.uint64(_TAIL)
    return block
