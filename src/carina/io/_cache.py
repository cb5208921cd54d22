"""Dropping a file from the page cache, so the next read measures the disk, not RAM."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["drop_cache"]


def drop_cache(path: str | Path) -> None:
    """Ask the kernel to evict ``path`` from this machine's page cache.

    In a VM this evicts the guest's cache only; the hypervisor may still cache the bytes.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
