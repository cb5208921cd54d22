"""Pinned host memory seen from a GPU: a device tensor over a host tensor's bytes (UVA, zero-copy).

Under CUDA's unified virtual addressing, memory from ``cudaHostAlloc`` (what torch's
``pin_memory`` allocates) is mapped into every device's address space at its host address.
:func:`mapped_view` wraps such a tensor in a CUDA tensor over the same bytes, without a copy:
a kernel that reads it (``index_select``, say) fetches the rows it touches across PCIe, so a
gather of scattered host rows needs no CPU gather and no staging copy::

    host = torch.empty(rows, dim, pin_memory=True)
    view = mapped_view(host, torch.device("cuda"))   # view.data_ptr() == host.data_ptr()
    x = view.index_select(0, ids_on_gpu)              # the GPU reads the rows over PCIe

:func:`device_view` is the form callers use: the mapped view on CUDA, the tensor itself on
the CPU (where host memory is the device's memory), ``None`` where the memory cannot be mapped.
"""

from __future__ import annotations

from typing import Any

__all__ = ["device_view", "mapped_view"]


class _Mapped:
    """A ``__cuda_array_interface__`` over a pinned host tensor (kept alive by the view).

    The ``data`` tuple's second item is the read-only flag and must be ``False``: torch refuses
    ``True`` ("the read only flag is not supported, should always be False"; the first H200 run
    of a zero-copy reader, session 8). Callers only read through the view all the same.
    """

    def __init__(self, host: Any) -> None:
        self.host = host
        self.__cuda_array_interface__ = {
            "shape": (host.shape[0], host[:1].numel() * host.element_size()),  # rows of bytes: any dtype
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "version": 3,
            "strides": None,
        }


def mapped_view(host: Any, device: Any) -> Any:
    """A CUDA tensor aliasing the pinned, contiguous 2-D ``host`` (no copy).

    Raises:
        ConfigError: ``host`` is not contiguous, not 2-D or not pinned.
        BackendUnavailable: The device does not see the memory at its host address (checked on the
            first and last rows).
    """
    import torch

    from carina.core.errors import BackendUnavailable, ConfigError

    if host.dim() != 2 or not host.is_contiguous() or not host.is_pinned():
        raise ConfigError("mapped_view needs a contiguous, pinned 2-D tensor", key="host")
    raw = torch.as_tensor(_Mapped(host), device=device)  # rows of bytes
    ends = [0, -1]  # compared as bytes: a row holding a NaN equals itself
    if raw.data_ptr() != host.data_ptr() or not torch.equal(raw[ends].cpu(), host.view(torch.uint8)[ends]):
        raise BackendUnavailable(f"the pinned host memory is not mapped at its host address on {device}")
    return raw.view(host.dtype).view(host.shape)


def device_view(host: Any, device: Any) -> Any | None:
    """How ``device`` reads ``host`` in place: itself on the CPU, a mapped view on CUDA, else ``None``.

    ``None`` when CUDA is not available, ``host`` is empty or not pinned (pageable memory
    is not mapped into the device's address space), or the device does not see it at its address.
    """
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return host
    if device.type != "cuda" or not torch.cuda.is_available() or host.numel() == 0 or not host.is_pinned():
        return None
    from carina.core.errors import BackendUnavailable

    try:
        return mapped_view(host, device)
    except BackendUnavailable:
        return None
