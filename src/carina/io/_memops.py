"""CUDA stream memory operations through the driver API (ctypes on ``libcuda``, nothing compiled).

``cuStreamWriteValue32`` makes a stream store a 32-bit value once the work
queued before it has run; ``cuStreamWaitValue32`` makes a stream wait until a
32-bit word is at least a value. Both act on pinned host memory mapped into
the device's address space, so a host thread and a CUDA stream can hand work
to each other without the host ever blocking on the stream.
"""

from __future__ import annotations

import ctypes
from typing import Any

from carina.core.errors import BackendUnavailable, IOEngineError

__all__ = ["MemOps", "memops_unavailable_reason"]

_WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
_WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: prior writes are visible first


def _symbol(lib: Any, *names: str) -> Any:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    raise BackendUnavailable(f"libcuda has none of {names}")


class MemOps:
    """The three driver calls the GPU-initiated path needs.

    Raises:
        BackendUnavailable: ``libcuda.so.1`` or one of its symbols is missing.
    """

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BackendUnavailable(f"libcuda.so.1 cannot be loaded: {exc}") from exc
        self._wait = _symbol(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self._write = _symbol(lib, "cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self._devptr = _symbol(lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
        self._name = _symbol(lib, "cuGetErrorName")
        for fn in (self._wait, self._write):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
        self._devptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        self._devptr.restype = ctypes.c_int
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self._name(rc, ctypes.byref(name))
            label = name.value.decode() if name.value else str(rc)
            raise IOEngineError(f"{what} failed: {label}", errno=rc)

    def device_pointer(self, host_address: int) -> int:
        """The device address of pinned host memory.

        Under unified addressing (every 64-bit Linux system CUDA supports) it is
        the host address itself; that is also the answer when the driver
        declines to map memory it did not allocate with ``DEVICEMAP``.
        """
        out = ctypes.c_uint64()
        rc = self._devptr(ctypes.byref(out), ctypes.c_void_p(host_address), 0)
        return int(out.value) if rc == 0 else host_address

    def wait_geq(self, stream: int, device_address: int, value: int) -> None:
        """Make ``stream`` wait until the word at ``device_address`` is >= ``value``."""
        self._check(self._wait(ctypes.c_void_p(stream), device_address, value, _WAIT_GEQ), "cuStreamWaitValue32")

    def write(self, stream: int, device_address: int, value: int) -> None:
        """Make ``stream`` store ``value`` at ``device_address`` after its earlier work."""
        self._check(self._write(ctypes.c_void_p(stream), device_address, value, _WRITE_DEFAULT), "cuStreamWriteValue32")


def memops_unavailable_reason() -> str | None:
    """Why stream memory operations cannot be used here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        MemOps()
    except BackendUnavailable as exc:
        return str(exc)
    return None
