"""Emulated confidential-computing link: CC's data path on hardware without CC mode.

Host-to-device, per chunk ``c`` of a transfer, serialised on one stream as CC mode does:
``T = T_enc(c)`` (real AES-GCM on the CPU into the bounce buffer, measured)
``+ T_dma(c)`` (real copy of the ciphertext to the device, measured, synchronised)
``+ c / gpu_crypto_Bps`` (the GPU's decryption, *modeled*) ``+ toll`` (a fixed cost per
crossing, *modeled*). Device-to-host is the mirror image: real copy, modeled GPU
encryption, real CPU decryption and verification of a same-sized sealed chunk. The
plaintext also reaches its destination (untimed) so workloads compute on true data.

Every time this module returns is emulated: part measured, part modeled, never a CC
measurement. :attr:`EmulatedCCLink.assumptions` lists the modeled parameters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from carina.core.config import Config, require
from carina.security.tee.bounce import BounceBuffer

__all__ = ["CCLinkConfig", "EmulatedCCLink", "device_copy"]


@dataclass(kw_only=True)
class CCLinkConfig(Config):
    """Parameters of the emulated CC link.

    Attributes:
        chunk: Bounce-buffer chunk in bytes.
        capacity: Largest single transfer in bytes.
        gpu_crypto_gbps: Modeled AES-GCM throughput of the GPU side (GB/s).
        toll_us: Modeled fixed cost per secure crossing (microseconds).
    """

    chunk: int = 1 << 20
    capacity: int = 64 << 20
    gpu_crypto_gbps: float = 100.0
    toll_us: float = 10.0

    def validate(self) -> None:
        """Check the fields."""
        require(self.chunk > 0, "must be positive", key="chunk")
        require(self.capacity >= self.chunk, "must be >= chunk", key="capacity")
        require(self.gpu_crypto_gbps > 0, "must be positive", key="gpu_crypto_gbps")
        require(self.toll_us >= 0, "must be >= 0", key="toll_us")


class EmulatedCCLink:
    """Moves torch tensors between host and ``device`` through an emulated CC data path."""

    def __init__(self, device: str, config: CCLinkConfig | None = None) -> None:
        import torch

        self.config = config or CCLinkConfig()
        self.device = torch.device(device)
        self.bounce = BounceBuffer(self.config.capacity, chunk=self.config.chunk)
        pin = self.device.type == "cuda"
        slots = self.config.chunk + 16
        self.staging = torch.empty(slots, dtype=torch.uint8, pin_memory=pin)
        self.device_slot = torch.empty(slots, dtype=torch.uint8, device=self.device)
        self._samples: dict[int, tuple[BounceBuffer, Any]] = {}
        self.crossings = 0
        self.bytes = 0

    @property
    def assumptions(self) -> dict[str, Any]:
        """The modeled (not measured) parameters, for records."""
        return {
            "gpu_crypto_gbps": self.config.gpu_crypto_gbps,
            "toll_us": self.config.toll_us,
            "chunk": self.config.chunk,
        }

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def _modeled(self, nbytes: int) -> float:
        return nbytes / (self.config.gpu_crypto_gbps * 1e9) + self.config.toll_us * 1e-6

    def h2d(self, src: Any, dst: Any) -> float:
        """Copy host tensor ``src`` into device tensor ``dst``; return the emulated seconds."""
        flat = src.contiguous().view(-1).view(dtype=_uint8())
        n = flat.numel()
        host = flat.numpy()
        total = 0.0
        for start in range(0, n, self.config.chunk):
            piece = host[start : start + self.config.chunk]
            t0 = time.perf_counter()
            sealed = self.bounce.seal(piece)
            m = len(sealed.data)
            self.staging[:m].numpy()[:] = sealed.data
            device_copy(self.device_slot[:m], self.staging[:m])
            self._sync()
            total += time.perf_counter() - t0 + self._modeled(len(piece))
            self.crossings += 1
        device_copy(dst.view(-1).view(dtype=_uint8()), flat.to(self.device))  # the plaintext, untimed
        self._sync()
        self.bytes += n
        return total

    def d2h(self, src: Any, dst: Any) -> float:
        """Copy device tensor ``src`` into host tensor ``dst``; return the emulated seconds."""
        flat = src.contiguous().view(-1).view(dtype=_uint8())
        n = flat.numel()
        total = 0.0
        for start in range(0, n, self.config.chunk):
            size = min(self.config.chunk, n - start)
            t0 = time.perf_counter()
            device_copy(self.staging[:size], flat[start : start + size])
            self._sync()
            self._open_like(size)
            total += time.perf_counter() - t0 + self._modeled(size)
            self.crossings += 1
        device_copy(dst.view(-1).view(dtype=_uint8()), flat.cpu())  # the plaintext, untimed
        self.bytes += n
        return total

    def _open_like(self, size: int) -> None:
        """Real CPU decryption and tag check of ``size`` bytes (a sample sealed once per size)."""
        sample = self._samples.get(size)
        if sample is None:
            buf = BounceBuffer(size, chunk=size)
            sample = (buf, buf.seal(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)))
            self._samples[size] = sample
        sample[0].open(sample[1])


def device_copy(dst: Any, src: Any) -> None:
    """``dst.copy_(src)``, except host-to-host, which is one plain memcpy.

    torch's CPU copy fans out to its thread pool, which on a busy machine turns a 30 us
    copy into tens of milliseconds of spin-waiting; a host "transfer" should cost what
    the memory system costs. Native and emulated paths both copy through here.
    """
    if dst.device.type == "cpu" and src.device.type == "cpu" and dst.is_contiguous() and src.is_contiguous():
        np.copyto(dst.view(-1).view(_uint8()).numpy(), src.reshape(-1).view(_uint8()).numpy())
        return
    dst.copy_(src)


def _uint8() -> Any:
    import torch

    return torch.uint8
