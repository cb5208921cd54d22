"""Staging arenas: shared memory of exactly the size asked, page-locked when CUDA is present.

Both kinds are viewed as a flat uint8 torch tensor and page-locked with
``cudaHostRegister`` when CUDA is available, so device-to-host copies into them
stay asynchronous:

- :class:`MappedArena` (``thread``, ``fork`` and ``sync`` writers): an anonymous
  ``MAP_SHARED`` mapping. torch's pinned allocator rounds every request up to a
  power of two (a 1.7 GB arena would pin 2 GB, a 17 GB one 32 GB); a registered
  mapping pins what it asks. Being shared, a forked writer child reads the
  arena's own pages: no copy-on-write, and no copy of pinned pages at ``fork()``.
- :class:`SharedArena` (``process`` writer): a POSIX shared-memory segment the
  persistent writer process maps by name.
"""

from __future__ import annotations

import mmap
import os
from multiprocessing import shared_memory
from typing import Any

from carina.core.errors import CapacityError

__all__ = ["MappedArena", "SharedArena", "attach", "mapped_arena", "shm_arena"]


def _register(tensor: Any) -> bool:
    """Page-lock ``tensor``'s memory for CUDA (False without CUDA or when the driver refuses)."""
    import torch

    if not torch.cuda.is_available():
        return False
    return int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel(), 0)) == 0


def _unregister(tensor: Any) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr())


class _Arena:
    """What both arenas share: a flat uint8 view, pinned when CUDA is present, released once."""

    tensor: Any = None
    pinned = False

    def _view(self, buffer: Any, nbytes: int) -> None:
        import torch

        self.tensor = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes)
        self.pinned = _register(self.tensor)

    def _unmap(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Unpin and release the memory (a mapping goes when the last view of it does)."""
        if self.tensor is None:
            return
        if self.pinned:
            _unregister(self.tensor)
        self.tensor = None
        self._unmap()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class MappedArena(_Arena):
    """An anonymous shared mapping of ``nbytes`` (page-aligned), pinned when CUDA is present."""

    def __init__(self, nbytes: int) -> None:
        self._map = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self._view(self._map, nbytes)

    def _unmap(self) -> None:
        try:
            self._map.close()
        except BufferError:  # views still exported: unmapped when they are collected
            pass


def mapped_arena(nbytes: int) -> tuple[Any, Any]:
    """The default :data:`carina.ckpt.staging.ArenaFactory`."""
    arena = MappedArena(nbytes)
    return arena.tensor, arena


_SHM_DIR = "/dev/shm"


class SharedArena(_Arena):
    """A named shared-memory segment; unlinked when closed."""

    def __init__(self, nbytes: int) -> None:
        st = os.statvfs(_SHM_DIR)
        free = st.f_bavail * st.f_frsize
        if free < nbytes:  # touching a segment beyond /dev/shm's size is a SIGBUS, not an error
            raise CapacityError(
                f"{_SHM_DIR} has {free} B free, the process writer's arena needs {nbytes} B "
                "(enlarge /dev/shm or use writer='fork')",
                requested=nbytes,
                free=free,
            )
        self._shm = shared_memory.SharedMemory(create=True, size=nbytes)
        self.name = self._shm.name
        self._view(self._shm.buf, nbytes)

    def _unmap(self) -> None:
        try:
            self._shm.close()
            self._shm.unlink()
        except (BufferError, FileNotFoundError):
            pass


def shm_arena(nbytes: int) -> tuple[Any, Any]:
    """An :data:`carina.ckpt.staging.ArenaFactory` for the process writer."""
    arena = SharedArena(nbytes)
    return arena.tensor, arena


def attach(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment in the writer process (the trainer owns and unlinks it)."""
    # The spawned writer shares the trainer's resource tracker, so attaching adds
    # nothing the trainer's unlink does not remove again.
    return shared_memory.SharedMemory(name=name)
