"""zlib's CRC-32 of many byte rows at once, on any torch device (one matrix product per batch).

CRC-32 is linear over GF(2). Started from a zero register, the CRC of a
message is the XOR of the contributions of its set bits, and the contribution
of bit ``b`` of byte ``p`` depends only on how many bytes follow it. For rows
of ``L`` bytes, the zero-register CRCs of all rows at once are therefore one
matrix product ``bits (n, 8L) @ G (8L, 32)`` taken mod 2 (exact in float32:
the sums stay below 2**24). A row holding only its first ``s`` bytes (the rest
zero) gets the CRC of ``s`` bytes followed by ``L - s`` zeros; undoing those
zeros is a 32x32 GF(2) matrix (the inverse of a zero-byte step, raised to
``L - s``), taken from two small tables of powers. zlib's CRC adds the
register's start and end constants, which for ``s`` bytes equal
``zlib.crc32(bytes(s))``::

    crc = RowCrc32(4096, "cuda")
    crcs = crc(rows, lengths)          # (n,) int64, == zlib.crc32(row[:s]) for every row

This keeps the CRC of every stored block on the accelerator with the codec, so
the host never touches payload bytes.
"""

from __future__ import annotations

import math
import threading
import zlib
from typing import Any

import numpy as np

__all__ = ["RowCrc32", "row_crc32"]

_POLY = 0xEDB88320
_BITS = np.arange(32, dtype=np.uint64)


def _table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        out.append(c)
    return out


_T = _table()
_TOP = {t >> 24: i for i, t in enumerate(_T)}  # the top bytes of the table are a permutation of 0..255
assert len(_TOP) == 256


def _zero_step(r: int) -> int:
    """The register after one more zero byte."""
    return (r >> 8) ^ _T[r & 0xFF]


def _zero_unstep(r: int) -> int:
    """Inverse of :func:`_zero_step` (the register before the last zero byte)."""
    i = _TOP[r >> 24]
    return (((r ^ _T[i]) << 8) | i) & 0xFFFFFFFF


def _bits(words: Any) -> np.ndarray:
    """``(...,)`` uint32 words -> ``(..., 32)`` 0/1 int64 bits (bit 0 first)."""
    return ((np.asarray(words, dtype=np.uint64)[..., None] >> _BITS) & 1).astype(np.int64)


def _matrix(step: Any) -> np.ndarray:
    """The GF(2) matrix ``F`` of a linear map on 32-bit words, for row vectors: ``bits(step(w)) = bits(w) @ F``."""
    return _bits([step(1 << j) for j in range(32)])


def _powers(f: np.ndarray, count: int) -> np.ndarray:
    """``[F**0, F**1, ..., F**(count-1)]`` mod 2."""
    out = np.empty((count, 32, 32), dtype=np.int64)
    out[0] = np.eye(32, dtype=np.int64)
    for k in range(1, count):
        out[k] = (out[k - 1] @ f) % 2
    return out


def _power(f: np.ndarray, k: int) -> np.ndarray:
    """``F**k`` mod 2 by repeated squaring."""
    out, base = np.eye(32, dtype=np.int64), f
    while k:
        if k & 1:
            out = (out @ base) % 2
        base = (base @ base) % 2
        k >>= 1
    return out


def _contributions(length: int) -> np.ndarray:
    """``(length, 8, 32)`` float32 bits: zero-register CRC of byte ``1 << b`` then ``d`` zero bytes, at ``[d, b]``."""
    base = [[_T[1 << b] for b in range(8)]]
    for _ in range(255):
        base.append([_zero_step(r) for r in base[-1]])
    step256 = _power(_matrix(_zero_step), 256).astype(np.float32)
    out = np.empty((-(-length // 256) * 256 * 8, 32), dtype=np.float32)
    cur = _bits(base).reshape(256 * 8, 32).astype(np.float32)  # distances 0..255; float: BLAS, exact (sums <= 32)
    for a in range(0, len(out), 256 * 8):
        out[a : a + 256 * 8] = cur
        cur = np.remainder(cur @ step256, 2)
    return out.reshape(-1, 8, 32)[:length]


class RowCrc32:
    """zlib CRC-32 of the first ``lengths[i]`` bytes of each row of an ``(n, length)`` uint8 tensor.

    Bytes of a row past its length must be zero (the caller masks them). Rows
    are cut into segments of ``seg`` bytes (at most 4 KiB): one product gives
    every segment's register, a second combines the segments of a row (each
    advanced past the bytes that follow it), so the tables stay small for any
    block size. :func:`row_crc32` caches one instance per length and device.

    Args:
        length: Row length ``L`` in bytes.
        device: Torch device the rows live on.
    """

    #: Bytes of float32 bit-planes one product may use (rows are processed in chunks below this).
    chunk_bytes = 1 << 28

    def __init__(self, length: int, device: str) -> None:
        import torch

        self.length, self.device = length, device
        self.seg = seg = length if length <= 4096 else math.gcd(length, 4096)
        g = _contributions(seg)[::-1].reshape(8 * seg, 32)  # byte p of a segment: distance seg-1-p
        nseg = length // seg
        after = _power(_matrix(_zero_step), seg)  # advance past one segment of zeros
        comb = np.empty((nseg, 32, 32), dtype=np.int64)
        comb[-1] = np.eye(32, dtype=np.int64)
        for j in range(nseg - 2, -1, -1):
            comb[j] = (comb[j + 1] @ after) % 2
        unstep = _matrix(_zero_unstep)
        lo = _powers(unstep, 256)
        hi = _powers(_power(unstep, 256), length // 256 + 1)
        zeros = np.empty(length + 1, dtype=np.int64)
        zeros[0] = c = 0
        for s in range(1, length + 1):
            zeros[s] = c = zlib.crc32(b"\0", c)
        f32 = torch.float32
        self._g = torch.from_numpy(np.ascontiguousarray(g)).to(device)
        self._comb = torch.from_numpy(comb.reshape(nseg * 32, 32)).to(device=device, dtype=f32)
        self._lo = torch.from_numpy(lo).to(device=device, dtype=f32)
        self._hi = torch.from_numpy(hi).to(device=device, dtype=f32)
        self._zeros = torch.from_numpy(zeros).to(device)
        self._shifts = torch.arange(8, dtype=torch.uint8, device=device)
        self._weights = torch.from_numpy((np.uint64(1) << _BITS).astype(np.int64)).to(device)

    def __call__(self, rows: Any, lengths: Any) -> Any:
        """CRC-32 of each row's first ``lengths`` bytes, as an ``(n,)`` int64 tensor on the rows' device."""
        import torch

        n, length = rows.shape
        if length != self.length:
            raise ValueError(f"rows of {length} bytes given to a CRC table for {self.length}")
        seg, nseg = self.seg, length // self.seg
        per = max(1, self.chunk_bytes // (32 * length))
        parts = []
        for a in range(0, n, per):
            chunk = rows[a : a + per].reshape(-1, seg)  # (rows * nseg, seg)
            bits = ((chunk.unsqueeze(-1) >> self._shifts) & 1).view(chunk.shape[0], 8 * seg)
            regs = torch.remainder(bits.to(torch.float32) @ self._g, 2)  # each segment's register
            parts.append(torch.remainder(regs.view(-1, nseg * 32) @ self._comb, 2))
        reg = torch.cat(parts) if len(parts) > 1 else parts[0]
        pad = length - lengths
        reg = torch.remainder(torch.bmm(reg.unsqueeze(1), self._hi[pad // 256]), 2)
        reg = torch.remainder(torch.bmm(reg, self._lo[pad % 256]), 2).squeeze(1)
        return (reg.to(torch.int64) * self._weights).sum(-1) ^ self._zeros[lengths]


_CACHE: dict[tuple[int, str], RowCrc32] = {}
_LOCK = threading.Lock()


def row_crc32(length: int, device: str) -> RowCrc32:
    """The (cached) :class:`RowCrc32` for rows of ``length`` bytes on ``device``."""
    key = (length, str(device))
    with _LOCK:
        table = _CACHE.get(key)
        if table is None:
            table = _CACHE[key] = RowCrc32(length, device)
            if str(device).startswith("cuda"):
                import torch

                torch.cuda.synchronize(device)  # the tables are used from other streams
        return table
