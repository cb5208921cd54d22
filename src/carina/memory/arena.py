"""Pinned host arenas: one big host allocation carved into aligned tensor views.

A :class:`HostArena` allocates its bytes once (page-locked when CUDA is present,
so host<->GPU copies run asynchronously at full PCIe speed) and hands out
aligned views with a bump allocator. ``reset()`` makes the whole arena free
again; views handed out before a reset must not be used after it.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from carina.core.errors import CapacityError, ConfigError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["HostArena", "PinMode"]

_DEFAULT_ALIGN = 4096


class PinMode(enum.Enum):
    """Whether an arena's memory is page-locked."""

    AUTO = "auto"  # pinned when CUDA is available
    ON = "on"  # pinned; a ConfigError where CUDA is absent
    OFF = "off"  # plain pageable memory


def _want_pin(mode: PinMode) -> bool:
    import torch

    cuda = torch.cuda.is_available()
    if mode is PinMode.ON and not cuda:
        raise ConfigError("pin='on' needs CUDA (pinned memory is a CUDA feature)", key="pin")
    return cuda and mode is not PinMode.OFF


class HostArena:
    """A fixed-size host buffer handing out aligned tensor views.

    Args:
        nbytes: Capacity in bytes (> 0).
        pin: ``"auto"`` (pinned when CUDA is available), ``"on"`` or ``"off"``.

    Attributes:
        pinned: Whether the memory is page-locked.
        capacity: Usable bytes.
    """

    def __init__(self, nbytes: int, pin: str | PinMode = "auto") -> None:
        import torch

        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ConfigError(f"arena size must be a positive int, got {nbytes!r}", key="nbytes")
        try:
            mode = PinMode(pin)
        except ValueError:
            raise ConfigError(f"pin must be 'auto', 'on' or 'off', got {pin!r}", key="pin") from None
        self.pinned = _want_pin(mode)
        raw = torch.empty(nbytes + _DEFAULT_ALIGN, dtype=torch.uint8, pin_memory=self.pinned)
        skew = (-raw.data_ptr()) % _DEFAULT_ALIGN
        self._raw = raw
        self._buf = raw[skew : skew + nbytes]
        self.capacity = nbytes
        self._used = 0
        self._peak = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes handed out since creation or the last :meth:`reset` (padding included)."""
        return self._used

    @property
    def free(self) -> int:
        """Bytes still available (before alignment padding of the next request)."""
        return self.capacity - self._used

    @property
    def peak(self) -> int:
        """Largest :attr:`used` ever reached."""
        return self._peak

    @property
    def base_ptr(self) -> int:
        """Address of the first byte (aligned to 4096)."""
        return int(self._buf.data_ptr())

    def alloc(
        self,
        nbytes_or_shape: int | Sequence[int],
        dtype: torch.dtype | None = None,
        align: int = _DEFAULT_ALIGN,
    ) -> torch.Tensor:
        """Carve a view out of the arena.

        Args:
            nbytes_or_shape: An int is a byte count (the result is 1-D with
                ``nbytes // itemsize`` elements; it must divide evenly); a
                sequence is the shape of the result.
            dtype: Element type of the view (default ``torch.uint8``).
            align: Byte alignment of the view's start (a power of two).

        Returns:
            A CPU tensor sharing the arena's memory (pinned when the arena is).

        Raises:
            CapacityError: The arena has no room for the request.
            ConfigError: Bad size, shape or alignment.
        """
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        shape, nbytes = _shape_and_bytes(nbytes_or_shape, itemsize)
        if align <= 0 or align & (align - 1):
            raise ConfigError(f"align must be a power of two, got {align}", key="align")
        with self._lock:
            start = _round_up(self.base_ptr + self._used, align) - self.base_ptr
            end = start + nbytes
            if end > self.capacity:
                raise CapacityError(
                    f"host arena full: asked {nbytes} B (align {align}), {self.capacity - self._used} B free "
                    f"of {self.capacity} B",
                    requested=nbytes,
                    free=self.capacity - self._used,
                )
            self._used = end
            self._peak = max(self._peak, end)
        view = self._buf[start:end]
        return view.view(dtype).view(shape)

    def numpy(self, tensor: torch.Tensor) -> np.ndarray:
        """A uint8 numpy view of a tensor handed out by this arena (for carina.io)."""
        return tensor.view(-1).view(__import__("torch").uint8).numpy()

    def reset(self) -> None:
        """Make the whole arena free again (earlier views must no longer be used)."""
        with self._lock:
            self._used = 0

    def __repr__(self) -> str:
        return f"HostArena(capacity={self.capacity}, used={self._used}, pinned={self.pinned})"


def _round_up(x: int, align: int) -> int:
    return (x + align - 1) // align * align


def _shape_and_bytes(spec: int | Sequence[int], itemsize: int) -> tuple[tuple[int, ...], int]:
    if isinstance(spec, bool):
        raise ConfigError("size must be an int or a shape", key="nbytes_or_shape")
    if isinstance(spec, int):
        if spec < 0 or spec % itemsize:
            raise ConfigError(
                f"{spec} bytes is not a non-negative multiple of the item size {itemsize}",
                key="nbytes_or_shape",
            )
        return (spec // itemsize,), spec
    shape = tuple(int(s) for s in spec)
    if any(s < 0 for s in shape):
        raise ConfigError(f"negative dimension in shape {shape}", key="nbytes_or_shape")
    return shape, math.prod(shape) * itemsize
