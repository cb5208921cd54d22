"""A minimal io_uring ring driven through raw system calls (ctypes, no liburing).

Only what the ``uring`` backend needs: set up a ring, map its three regions,
write submission entries, enter the kernel, read completion entries. Layouts
follow ``include/uapi/linux/io_uring.h``. The kernel reads the submission tail
and writes the completion tail; with no SQPOLL thread it reads our entries only
inside ``io_uring_enter``, and the system call orders our stores before it.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct

import numpy as np

__all__ = ["Ring", "OP_READ", "OP_READV", "OP_WRITE", "OP_WRITEV", "OP_READ_FIXED", "OP_WRITE_FIXED"]

_SYSCALLS = {"x86_64": (425, 426, 427), "aarch64": (425, 426, 427)}
OP_READV, OP_WRITEV, OP_READ_FIXED, OP_WRITE_FIXED, OP_READ, OP_WRITE = 1, 2, 4, 5, 22, 23
_ENTER_GETEVENTS = 1
_FEAT_SINGLE_MMAP = 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_REGISTER_BUFFERS = 0
_SQE = struct.Struct("<BBHiQQIIQHHiQQ")  # 64 bytes
_CQE = struct.Struct("<QiI")  # 16 bytes
_U32 = struct.Struct("<I")
SQE_DTYPE = np.dtype(
    [
        ("opcode", "u1"),
        ("flags", "u1"),
        ("ioprio", "<u2"),
        ("fd", "<i4"),
        ("off", "<u8"),
        ("addr", "<u8"),
        ("len", "<u4"),
        ("rw_flags", "<u4"),
        ("user_data", "<u8"),
        ("buf_index", "<u2"),
        ("personality", "<u2"),
        ("splice_fd_in", "<i4"),
        ("addr3", "<u8"),
        ("pad", "<u8"),
    ]
)
CQE_DTYPE = np.dtype([("user_data", "<u8"), ("res", "<i4"), ("flags", "<u4")])


class _Params(ctypes.Structure):
    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        # io_sqring_offsets: head tail ring_mask ring_entries flags dropped array resv1 user_addr
        ("sq_off", ctypes.c_uint32 * 8),
        ("sq_user_addr", ctypes.c_uint64),
        # io_cqring_offsets: head tail ring_mask ring_entries overflow cqes flags resv1 user_addr
        ("cq_off", ctypes.c_uint32 * 8),
        ("cq_user_addr", ctypes.c_uint64),
    ]


assert ctypes.sizeof(_Params) == 120 and _SQE.size == SQE_DTYPE.itemsize == 64 and CQE_DTYPE.itemsize == 16

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_L = ctypes.c_long


def syscall_numbers() -> tuple[int, int, int] | None:
    """(setup, enter, register) on this architecture, or None."""
    return _SYSCALLS.get(platform.machine())


class Ring:
    """One io_uring instance with ``entries`` submission slots.

    Raises:
        OSError: The kernel refuses io_uring (disabled, seccomp, too old).
    """

    def __init__(self, entries: int) -> None:
        numbers = syscall_numbers()
        if numbers is None:
            raise OSError(errno.ENOSYS, f"io_uring syscall numbers unknown on {platform.machine()}")
        self._setup, self._enter, self._register = numbers
        params = _Params()
        fd = _libc.syscall(_L(self._setup), _L(entries), ctypes.byref(params))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd = int(fd)
        self.sq_entries, self.cq_entries = params.sq_entries, params.cq_entries
        sq, cq = list(params.sq_off), list(params.cq_off)
        sq_size = sq[6] + params.sq_entries * 4
        cq_size = cq[5] + params.cq_entries * _CQE.size
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | mmap.MAP_POPULATE
        if params.features & _FEAT_SINGLE_MMAP:
            self._sq_ring = mmap.mmap(self.fd, max(sq_size, cq_size), flags, prot, offset=_OFF_SQ_RING)
            self._cq_ring = self._sq_ring
        else:
            self._sq_ring = mmap.mmap(self.fd, sq_size, flags, prot, offset=_OFF_SQ_RING)
            self._cq_ring = mmap.mmap(self.fd, cq_size, flags, prot, offset=_OFF_CQ_RING)
        self._sqes = mmap.mmap(self.fd, params.sq_entries * _SQE.size, flags, prot, offset=_OFF_SQES)
        self._sq_head, self._sq_tail, self._sq_mask, self._sq_array = sq[0], sq[1], sq[2], sq[6]
        self._cq_head, self._cq_tail, self._cq_mask, self._cqes = cq[0], cq[1], cq[2], cq[5]
        self._mask = _U32.unpack_from(self._sq_ring, self._sq_mask)[0]
        self._cmask = _U32.unpack_from(self._cq_ring, self._cq_mask)[0]
        self._tail = _U32.unpack_from(self._sq_ring, self._sq_tail)[0]
        self._unsubmitted = 0
        self._sqe_array = np.frombuffer(self._sqes, dtype=SQE_DTYPE)
        self._index_array = np.frombuffer(self._sq_ring, dtype="<u4", count=params.sq_entries, offset=self._sq_array)
        self._cqe_array = np.frombuffer(self._cq_ring, dtype=CQE_DTYPE, count=params.cq_entries, offset=self._cqes)
        self._index_array[:] = np.arange(params.sq_entries, dtype="<u4")  # slot i holds entry i, set once
        self._cq_user, self._cq_res = self._cqe_array["user_data"], self._cqe_array["res"]
        self._raw = np.frombuffer(self._sqes, dtype=np.uint64).reshape(-1, 8)  # the entries as 8 words each

    def prepare(
        self, opcode: int, fd: int, offset: int, addr: int, length: int, user_data: int, buf_index: int = 0
    ) -> None:
        """Write one submission entry (sent by the next :meth:`enter`)."""
        index = self._tail & self._mask
        _SQE.pack_into(
            self._sqes, index * 64, opcode, 0, 0, fd, offset, addr, length, 0, user_data, buf_index, 0, 0, 0, 0
        )
        self._tail = (self._tail + 1) & 0xFFFFFFFF
        self._unsubmitted += 1

    @staticmethod
    def entries(
        opcode: int, fd: int, offsets: np.ndarray, addrs: np.ndarray, lengths: np.ndarray, user_data: np.ndarray
    ) -> np.ndarray:
        """Build ``len(offsets)`` submission entries off the ring, as a ``(k, 8)`` uint64 array for :meth:`put`.

        Fields not given (flags, ``buf_index``, ...) are zero.
        """
        out = np.zeros(len(offsets), dtype=SQE_DTYPE)
        out["opcode"], out["fd"], out["off"], out["addr"] = opcode, fd, offsets, addrs
        out["len"], out["user_data"] = lengths, user_data
        return out.view(np.uint64).reshape(len(offsets), 8)

    def put(self, entries: np.ndarray) -> None:
        """Copy entries made by :meth:`entries` into the ring (sent by the next :meth:`enter`): one store per run."""
        k = len(entries)
        first = self._tail & self._mask
        split = min(k, self._mask + 1 - first)  # entries before the ring wraps
        self._raw[first : first + split] = entries[:split]
        if split < k:
            self._raw[: k - split] = entries[split:]
        self._tail = (self._tail + k) & 0xFFFFFFFF
        self._unsubmitted += k

    def completion_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Take every ready completion as arrays ``(user_data, result)`` (copies: slots are reused).

        ``result`` is int32 (bytes moved, or ``-errno``).
        """
        head = _U32.unpack_from(self._cq_ring, self._cq_head)[0]
        tail = _U32.unpack_from(self._cq_ring, self._cq_tail)[0]
        n = (tail - head) & 0xFFFFFFFF
        first = head & self._cmask
        if first + n <= self._cmask + 1:  # one slice: two strided copies, no temporary
            user, res = self._cq_user[first : first + n].copy(), self._cq_res[first : first + n].copy()
        else:
            idx = (head + np.arange(n, dtype=np.uint64)) & np.uint64(self._cmask)
            user, res = self._cq_user[idx], self._cq_res[idx]
        _U32.pack_into(self._cq_ring, self._cq_head, tail)
        return user, res

    def enter(self, wait: int) -> int:
        """Publish prepared entries, submit them, wait for ``wait`` completions (GIL released).

        Returns:
            Entries the kernel consumed.
        """
        _U32.pack_into(self._sq_ring, self._sq_tail, self._tail)
        n = self._unsubmitted
        while True:
            rc = _libc.syscall(
                _L(self._enter), _L(self.fd), _L(n), _L(wait), _L(_ENTER_GETEVENTS if wait else 0), None, _L(0)
            )
            if rc >= 0:
                break
            err = ctypes.get_errno()
            if err not in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
            if err != errno.EINTR:
                wait = 0  # completions are pending; reap them first
        self._unsubmitted -= int(rc)
        return int(rc)

    def completions(self) -> list[tuple[int, int]]:
        """Take every ready completion as ``(user_data, result)``."""
        head = _U32.unpack_from(self._cq_ring, self._cq_head)[0]
        tail = _U32.unpack_from(self._cq_ring, self._cq_tail)[0]
        out = []
        while head != tail:
            user_data, res, _ = _CQE.unpack_from(self._cq_ring, self._cqes + (head & self._cmask) * _CQE.size)
            out.append((user_data, res))
            head = (head + 1) & 0xFFFFFFFF
        _U32.pack_into(self._cq_ring, self._cq_head, head)
        return out

    def register_buffers(self, buffers: list[tuple[int, int]]) -> None:
        """Register ``(address, length)`` regions for ``READ_FIXED``/``WRITE_FIXED``."""
        iovecs = (ctypes.c_uint64 * (2 * len(buffers)))(*[x for pair in buffers for x in pair])
        rc = _libc.syscall(_L(self._register), _L(self.fd), _L(_REGISTER_BUFFERS), iovecs, _L(len(buffers)))
        if rc < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_uring_register(BUFFERS): {os.strerror(err)}")

    def close(self) -> None:
        """Unmap the regions and close the ring."""
        del self._sqe_array, self._index_array, self._cqe_array, self._raw, self._cq_user, self._cq_res
        for region in {id(r): r for r in (self._sqes, self._sq_ring, self._cq_ring)}.values():
            region.close()
        os.close(self.fd)
