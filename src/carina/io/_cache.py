"""Dropping a file from the page cache, so the next read measures the disk, not RAM.

:func:`drop_cache` evicts one file (``POSIX_FADV_DONTNEED``); :func:`make_cold` also
flushes it first (dirty pages are not dropped), writes ``/proc/sys/vm/drop_caches`` when
allowed (root), and reports what it did and how much of the file was resident before and
after (:func:`resident_fraction`, from ``mincore``), so a "cold" baseline can show it was.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["drop_cache", "make_cold", "resident_fraction"]

_DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_cache(path: str | Path) -> None:
    """Ask the kernel to evict ``path`` from this machine's page cache.

    In a VM this evicts the guest's cache only; the hypervisor may still cache the bytes.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path: str | Path) -> float:
    """Share of ``path``'s pages in this machine's page cache (``mincore`` over a read-only map)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-size // page)
    arr = np.memmap(path, dtype=np.uint8, mode="r")
    vec = np.zeros(pages, dtype=np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    try:
        if libc.mincore(arr.ctypes.data, size, vec.ctypes.data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore failed: {os.strerror(err)}", str(path))
    finally:
        del arr
    return float(np.count_nonzero(vec & 1)) / pages


def make_cold(path: str | Path, *, system: bool = True) -> dict[str, Any]:
    """Flush ``path``, evict it (and, with ``system`` and root, every clean page) from the page cache.

    Returns:
        ``resident_before`` / ``resident_after`` (shares of the file's pages), ``fadvise``
        (always done), ``drop_caches`` (whether ``/proc/sys/vm/drop_caches`` was written)
        and, if writing it failed, ``drop_caches_error``.
    """
    before = resident_fraction(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages survive DONTNEED: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    out: dict[str, Any] = {"resident_before": before, "fadvise": True, "drop_caches": False}
    if system and os.geteuid() == 0:
        try:
            os.sync()
            _DROP_CACHES.write_text("1\n")
            out["drop_caches"] = True
        except OSError as exc:  # a container may mount /proc/sys read-only
            out["drop_caches_error"] = str(exc)
    out["resident_after"] = resident_fraction(path)
    return out
