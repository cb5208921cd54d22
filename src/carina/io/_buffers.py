"""Byte views of the buffers callers hand the engine, and aligned allocation.

A request's buffer may be a ``bytearray``, a ``memoryview``, a NumPy array or a
contiguous CPU torch tensor (any dtype); each becomes a flat ``memoryview`` of
unsigned bytes that the backends read into or write from without copying.
CUDA tensors are handled by the engine through pinned staging.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

from carina.core.errors import ConfigError

__all__ = ["address_of", "aligned_buffer", "byte_view", "is_cuda_tensor", "is_torch_tensor"]


def aligned_buffer(nbytes: int, alignment: int = 4096) -> np.ndarray:
    """Allocate ``nbytes`` of zeroed memory whose address is a multiple of ``alignment``.

    Args:
        nbytes: Size in bytes (may be 0).
        alignment: A power of two.

    Returns:
        A 1-D ``numpy.uint8`` array, suitable for O_DIRECT reads and writes.
    """
    if nbytes < 0:
        raise ConfigError("nbytes must be >= 0", key="nbytes")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ConfigError("alignment must be a power of two", key="alignment")
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start : start + nbytes]
    assert nbytes == 0 or out.ctypes.data % alignment == 0
    return out


def is_torch_tensor(obj: Any) -> bool:
    """True for a torch tensor, without importing torch when it is not loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_cuda_tensor(obj: Any) -> bool:
    """True for a torch tensor that lives on a GPU."""
    return is_torch_tensor(obj) and obj.device.type != "cpu"


def byte_view(buf: Any, *, writable: bool) -> memoryview:
    """Return a flat, C-contiguous ``memoryview`` of ``buf``'s bytes (format ``B``).

    Raises:
        ConfigError: The buffer is not contiguous, not on the CPU, or read-only
            where it must be written into.
    """
    if is_torch_tensor(buf):
        if buf.device.type != "cpu":
            raise ConfigError(f"tensor on {buf.device} needs the engine's staging path", key="buf")
        if not buf.is_contiguous():
            raise ConfigError("tensor must be contiguous", key="buf")
        import torch

        buf = buf.detach().reshape(-1).view(torch.uint8).numpy()
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ConfigError("numpy array must be C-contiguous", key="buf")
        if writable and not buf.flags.writeable:
            raise ConfigError("numpy array is read-only; a read needs a writable buffer", key="buf")
        view = buf.reshape(-1).view(np.uint8).data
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            raise ConfigError(f"{type(buf).__name__} does not expose a buffer", key="buf") from None
        if not view.c_contiguous:
            raise ConfigError("buffer must be C-contiguous", key="buf")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    if writable and view.readonly:
        raise ConfigError(f"{type(buf).__name__} is read-only; a read needs a writable buffer", key="buf")
    return view


def address_of(view: memoryview) -> int:
    """The address of the first byte of ``view`` (0 for an empty view)."""
    if view.nbytes == 0:
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])
