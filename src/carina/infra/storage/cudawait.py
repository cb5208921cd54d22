"""How a GPU engine's launch threads wait for the device: CUDA's default (spin) or blocking sync.

CUDA's default schedule lets a thread that waits for the device (``cudaStreamSynchronize``, the wait
inside nvCOMP's batched calls) spin on its core while the GPU has work and few threads. Behind several
front-end processes pinned to the same cores, every spinning launch thread takes time the front ends
need (session 7 on the H200 measured the nvCOMP engine at 23x-27x the CPU tier's host CPU per GB of
4 KiB reads). ``block`` sets ``CU_CTX_SCHED_BLOCKING_SYNC`` on the device's primary context through
the driver API (ctypes on ``libcuda``), so those waits sleep on an OS primitive instead; it has to be
set before the engine's first CUDA call in the process, and the engines call it first.
"""

from __future__ import annotations

import ctypes
import enum

from carina.core.errors import BackendUnavailable

__all__ = ["CudaWait", "set_cuda_wait"]

_SCHED_BLOCKING_SYNC = 0x04  # CU_CTX_SCHED_BLOCKING_SYNC


class CudaWait(enum.Enum):
    """How a thread waiting for the device waits."""

    SPIN = "spin"  # CUDA's default (automatic: spin while few threads wait)
    BLOCK = "block"  # CU_CTX_SCHED_BLOCKING_SYNC on the primary context


def _device_index(device: str) -> int | None:
    """``cuda`` / ``cuda:N`` -> N (0 for ``cuda``); ``None`` for anything that is not CUDA."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


def set_cuda_wait(device: str, mode: CudaWait, *, library: str = "libcuda.so.1") -> str:
    """Make the primary context of ``device`` wait as ``mode`` says; what was done, in words.

    Args:
        device: The engine's torch device (``cuda``, ``cuda:N``; others are left alone).
        mode: :class:`CudaWait`.
        library: The CUDA driver library to load.

    Raises:
        BackendUnavailable: ``block`` was asked for a CUDA device and the driver refused or is missing.
    """
    index = _device_index(device)
    if mode is CudaWait.SPIN:
        return "spin: CUDA's default schedule"
    if index is None:
        return f"block asked, but {device} is not a CUDA device: nothing to set"
    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        raise BackendUnavailable(f"cuda_wait=block needs the CUDA driver: {exc}", device=device) from exc
    dev = ctypes.c_int()
    for what, rc in (("cuInit", lambda: lib.cuInit(0)),
                     ("cuDeviceGet", lambda: lib.cuDeviceGet(ctypes.byref(dev), index)),
                     ("cuDevicePrimaryCtxSetFlags",
                      lambda: _set_flags(lib, dev.value, _SCHED_BLOCKING_SYNC))):  # fmt: skip
        code = int(rc())
        if code != 0:
            raise BackendUnavailable(f"cuda_wait=block: {what} failed with CUresult {code}", device=device)
    return f"block: CU_CTX_SCHED_BLOCKING_SYNC set on device {index}'s primary context"


def _set_flags(lib: ctypes.CDLL, dev: int, flags: int) -> int:
    fn = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    return int(fn(ctypes.c_int(dev), ctypes.c_uint(flags)))
