"""Shared-memory arenas for the ``process`` writer.

A :class:`carina.memory.HostArena` is private to the trainer; the persistent
writer process needs memory it can map by name. This arena is a POSIX shared
memory segment viewed as a torch tensor, page-locked with ``cudaHostRegister``
when CUDA is available so device-to-host copies into it stay asynchronous.
"""

from __future__ import annotations

import os
from multiprocessing import shared_memory
from typing import Any

from carina.core.errors import CapacityError

__all__ = ["SharedArena", "attach", "shm_arena"]

_SHM_DIR = "/dev/shm"


class SharedArena:
    """A named shared-memory segment; unlinked when closed."""

    def __init__(self, nbytes: int) -> None:
        import torch

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
        self.tensor: Any = torch.frombuffer(self._shm.buf, dtype=torch.uint8, count=nbytes)
        self.pinned = False
        if torch.cuda.is_available():
            rc = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), nbytes, 0)
            self.pinned = int(rc) == 0

    def close(self) -> None:
        """Unpin, unmap and unlink the segment."""
        import torch

        if self.tensor is None:
            return
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
        self.tensor = None
        try:
            self._shm.close()
            self._shm.unlink()
        except (BufferError, FileNotFoundError):
            pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
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
