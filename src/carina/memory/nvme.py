"""The NVMe tier: one file carved into aligned extents, moved through carina.io.

Every byte goes through a :class:`carina.io.IOEngine` (O_DIRECT where the file
system allows it); this module only decides *where* in the file a tensor lives.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carina.core.errors import CapacityError, ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["Extent", "ExtentAllocator", "NvmeTier"]

_ALIGN = 4096


@dataclass(frozen=True)
class Extent:
    """A byte range of the tier's file (offset and length are 4 KiB aligned)."""

    offset: int
    length: int


class ExtentAllocator:
    """First-fit allocator of aligned extents inside ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity // _ALIGN * _ALIGN
        self._free: list[Extent] = [Extent(0, self.capacity)] if self.capacity else []
        self.used = 0

    def alloc(self, nbytes: int) -> Extent:
        """Reserve an extent of at least ``nbytes`` (rounded up to 4 KiB)."""
        need = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        for i, ext in enumerate(self._free):
            if ext.length >= need:
                rest = Extent(ext.offset + need, ext.length - need)
                self._free[i : i + 1] = [rest] if rest.length else []
                self.used += need
                return Extent(ext.offset, need)
        raise CapacityError(
            f"NVMe tier full: need {need} B, {self.capacity - self.used} B free (fragmented) of {self.capacity} B",
            requested=need,
        )

    def free(self, ext: Extent) -> None:
        """Return an extent; neighbours are merged."""
        self.used -= ext.length
        spans = sorted([*self._free, ext], key=lambda e: e.offset)
        merged: list[Extent] = []
        for e in spans:
            if merged and merged[-1].offset + merged[-1].length == e.offset:
                last = merged.pop()
                merged.append(Extent(last.offset, last.length + e.length))
            else:
                merged.append(e)
        self._free = merged


class NvmeTier:
    """Tensors stored in one file under ``directory``, read and written via carina.io.

    Args:
        directory: Where the tier's file is created (removed again on :meth:`close`).
        capacity: Byte budget of the tier.
        engine: An open :class:`carina.io.IOEngine`; one is made (and owned) when None.
    """

    def __init__(self, directory: str | Path, capacity: int, engine: Any = None) -> None:
        from carina.io import Direct, IOConfig, IOEngine

        directory = Path(directory)
        if not directory.is_dir():
            raise ConfigError(f"NVMe directory {directory} does not exist", key="nvme_path")
        self.path = directory / f"carina-tier-{os.getpid()}-{id(self):x}.bin"
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else IOEngine(IOConfig(backend="auto", direct=Direct.AUTO))
        self.handle = self.engine.open(self.path, "rw")
        self.alloc = ExtentAllocator(capacity)
        self._lock = threading.Lock()

    def write(self, tensor: torch.Tensor) -> tuple[Extent, Any]:
        """Start writing a contiguous CPU tensor; returns its extent and the IO future."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            ext = self.alloc.alloc(nbytes)
        buf = tensor.detach().reshape(-1).view(__import__("torch").uint8)
        return ext, self.engine.write(self.handle, ext.offset, buf)

    def read(self, ext: Extent, out: torch.Tensor) -> Any:
        """Start reading an extent into the contiguous CPU tensor ``out``; returns the future."""
        buf = out.reshape(-1).view(__import__("torch").uint8)
        return self.engine.read(self.handle, ext.offset, buf)

    def free(self, ext: Extent) -> None:
        """Give an extent back."""
        with self._lock:
            self.alloc.free(ext)

    def close(self) -> None:
        """Close the file (and the engine when owned) and delete the file."""
        self.engine.close_file(self.handle)
        if self._owns_engine:
            self.engine.close()
        self.path.unlink(missing_ok=True)
