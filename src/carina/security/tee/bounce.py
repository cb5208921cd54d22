"""AES-GCM bounce buffers: the confidential-computing data path, on the CPU, for real.

In CC mode the GPU cannot DMA from TEE-private memory, so the driver encrypts each
chunk with AES-GCM into a shared (bounce) buffer, the GPU copies the ciphertext and
decrypts it into protected memory; device-to-host runs the other way. :class:`BounceBuffer`
does the CPU half exactly so: one key per channel, a 96-bit nonce per chunk from a
counter (never reused), a 16-byte tag per chunk, ``AESGCM.encrypt_into`` into a
preallocated buffer (no allocation per chunk). Decryption verifies every tag; a tampered chunk raises
:class:`~carina.core.errors.ValidationFailed` and nothing of it is returned.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from carina.core.errors import ConfigError, ValidationFailed

__all__ = ["BounceBuffer", "Sealed", "aes_gcm_throughput"]

TAG = 16


@dataclass
class Sealed:
    """Ciphertext of one transfer, chunk by chunk.

    Chunk ``i`` (ciphertext then its 16-byte tag) is
    ``data[offsets[i] + i * TAG : offsets[i + 1] + (i + 1) * TAG]``.
    """

    data: np.ndarray
    nonces: list[bytes]
    offsets: list[int]

    def chunk(self, i: int) -> tuple[int, int]:
        """Byte range of chunk ``i`` (with its tag) in :attr:`data`."""
        return self.offsets[i] + i * TAG, self.offsets[i + 1] + (i + 1) * TAG


class BounceBuffer:
    """A channel's key, nonce counter and preallocated bounce buffer.

    Args:
        capacity: Largest transfer in bytes.
        chunk: Encryption chunk in bytes (the driver works in chunks; 64 KiB-1 MiB is
            where AES-GCM on the CPU is fastest).
        key: 32-byte AES-256 key (random if not given).
    """

    def __init__(self, capacity: int, *, chunk: int = 1 << 20, key: bytes | None = None) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if capacity <= 0 or chunk <= 0:
            raise ConfigError("capacity and chunk must be positive", key="chunk")
        self.key = key or os.urandom(32)
        if len(self.key) != 32:
            raise ConfigError("AES-256 needs a 32-byte key", key="key")
        self.aead = AESGCM(self.key)
        self.chunk = chunk
        self.capacity = capacity
        self.buffer = np.empty(capacity + TAG * (-(-capacity // chunk)), dtype=np.uint8)
        self._counter = 0

    def _nonce(self) -> bytes:
        self._counter += 1
        return self._counter.to_bytes(12, "big")

    def seal(self, src: memoryview | bytes | np.ndarray) -> Sealed:
        """Encrypt ``src`` chunk by chunk into the bounce buffer (overwritten by the next call)."""
        view = memoryview(src).cast("B")  # type: ignore[arg-type]
        n = len(view)
        if n > self.capacity:
            raise ConfigError(f"transfer of {n} bytes exceeds the bounce buffer ({self.capacity})", key="capacity")
        nonces, offsets = [], [0]
        out = memoryview(self.buffer)  # type: ignore[arg-type]
        for i, start in enumerate(range(0, n, self.chunk)):
            end = min(n, start + self.chunk)
            nonce = self._nonce()
            self.aead.encrypt_into(nonce, view[start:end], None, out[start + i * TAG : end + (i + 1) * TAG])
            nonces.append(nonce)
            offsets.append(end)
        used = n + TAG * (len(offsets) - 1)
        return Sealed(self.buffer[:used], nonces, offsets)

    def open(self, sealed: Sealed, dst: np.ndarray | None = None) -> np.ndarray:
        """Decrypt and verify every chunk; raise :class:`ValidationFailed` on any bad tag."""
        from cryptography.exceptions import InvalidTag

        n = sealed.offsets[-1]
        out = np.empty(n, dtype=np.uint8) if dst is None else dst
        view = memoryview(out).cast("B")  # type: ignore[arg-type]
        src = memoryview(sealed.data).cast("B")  # type: ignore[arg-type]
        for i, nonce in enumerate(sealed.nonces):
            a, b = sealed.chunk(i)
            try:
                self.aead.decrypt_into(nonce, src[a:b], None, view[sealed.offsets[i] : sealed.offsets[i + 1]])
            except InvalidTag:
                view[: sealed.offsets[i + 1]] = bytes(sealed.offsets[i + 1])  # nothing unauthenticated leaks
                raise ValidationFailed(
                    f"AES-GCM tag mismatch: chunk {i} was tampered with", offset=sealed.offsets[i]
                ) from None
        return out


def aes_gcm_throughput(chunk: int, *, total: int = 64 << 20, repeat: int = 3) -> float:
    """Measured AES-256-GCM encryption throughput in bytes/s for ``chunk``-sized pieces (best of ``repeat``)."""
    buf = BounceBuffer(total, chunk=chunk)
    src = np.random.default_rng(0).integers(0, 256, total, dtype=np.uint8)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        buf.seal(src)
        best = min(best, time.perf_counter() - t0)
    return total / best
