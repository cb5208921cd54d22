"""Tensors in CUDA managed (unified) memory, for training state that lives there.

CRUM's subject is unified memory: pages that migrate between host and device
on demand. A PyTorch tensor can live in it (:func:`managed_empty` allocates
with the driver's ``cuMemAllocManaged`` and hands the memory to torch through
``__cuda_array_interface__``; torch 2.11 has no managed allocator of its own).
The checkpointer needs nothing special for them: staging copies them into the
pinned arena on its side stream like any CUDA tensor (the driver migrates or
reads the pages), so a forked writer never touches managed memory (its pages
are unmapped in a child), and restore copies back into them in place.

Allocation refuses to ask for more than the GPU has free: oversubscribing
managed memory can stall the device for a long time.
"""

from __future__ import annotations

import ctypes
from typing import Any

from carina.core.errors import BackendUnavailable, CapacityError

__all__ = ["is_managed", "managed_empty"]

_CU_MEM_ATTACH_GLOBAL = 1
_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
_lib: Any = None


def _driver() -> Any:
    global _lib
    if _lib is None:
        try:
            _lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BackendUnavailable(f"no CUDA driver library: {exc}", key="libcuda.so.1") from exc
        _lib.cuMemAllocManaged.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_uint]
        _lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        _lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    return _lib


class _Managed:
    """Owns one managed allocation; torch keeps it alive as long as the tensor."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.ptr = ptr
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 2}

    def __del__(self) -> None:
        if self.ptr and _lib is not None:
            _lib.cuMemFree_v2(ctypes.c_uint64(self.ptr))
            self.ptr = 0


def managed_empty(shape: tuple[int, ...], dtype: Any, device: Any = "cuda") -> Any:
    """An uninitialised CUDA tensor in managed memory.

    Raises:
        CapacityError: The tensor is larger than the GPU's free memory.
        BackendUnavailable: No CUDA driver or the allocation failed.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        raise BackendUnavailable("managed memory needs a CUDA device", key=str(dev))
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    with torch.cuda.device(dev):
        free, _ = torch.cuda.mem_get_info()
        if nbytes > free:
            raise CapacityError(f"{nbytes} bytes of managed memory asked, {free} free on the GPU", key=str(dev))
        torch.cuda.current_stream().synchronize()  # a context is current on this thread
        ptr = ctypes.c_uint64(0)
        err = _driver().cuMemAllocManaged(ctypes.byref(ptr), max(nbytes, 1), _CU_MEM_ATTACH_GLOBAL)
        if err != 0:
            raise BackendUnavailable(f"cuMemAllocManaged failed with CUDA error {err}", key=str(dev))
        typestr = {torch.float32: "<f4", torch.float16: "<f2", torch.int64: "<i8", torch.uint8: "|u1"}.get(dtype)
        if typestr is None:  # e.g. bfloat16 has no array-interface type: allocate bytes, view as dtype
            raw = torch.as_tensor(_Managed(ptr.value, (nbytes,), "|u1"), device=dev)
            return raw.view(dtype).view(shape)
        return torch.as_tensor(_Managed(ptr.value, tuple(shape), typestr), device=dev)


def is_managed(tensor: Any) -> bool:
    """Whether a CUDA tensor's memory is managed (unified) memory."""
    if not getattr(tensor, "is_cuda", False):
        return False
    flag = ctypes.c_uint(0)
    err = _driver().cuPointerGetAttribute(ctypes.byref(flag), _CU_POINTER_ATTRIBUTE_IS_MANAGED, tensor.data_ptr())
    return err == 0 and bool(flag.value)
