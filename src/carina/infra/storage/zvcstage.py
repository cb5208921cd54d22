"""A ZVC batch's host side: blocks in and out of the arena with one numpy call per group, buffers kept.

:class:`~carina.infra.storage.zvcbatch.ZvcBatcher` moves a group of ``m`` blocks of ``L`` bytes (one
operation and block length) between the arena and ``(m, L)`` device rows. Blocks at any byte offsets
are gathered with one fancy index of a sliding-window view of the arena (``windows(L)[offsets]``, row
``o`` being the ``L`` bytes at offset ``o``) and scattered back the same way, instead of one slice copy
per run of back-to-back blocks. Above :data:`LOOP_ABOVE` bytes a block's copy costs more than the
temporary of a fancy index saves, so large blocks are copied one slice each. The host buffers a batch
uses (staging for rows that do not lie back to back, the CRC-checked jobs' metadata, the results read
back) are kept per launch thread and grown by doubling, page-locked when the rows live on a GPU; a
batch allocates no host memory and reads the device back with one wait::

    stage = HostStage(arena_np, host_tensor)
    up = stage.buffer("up", nbytes, device)      # this thread's staging, reused by the next batch
    stage.gather(up_np_rows, src_offsets, length)
    stage.scatter(rows_np, dst_offsets, length)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["LOOP_ABOVE", "MAX_VIEWS", "HostStage"]

#: Batch shapes whose views a launch thread keeps.
MAX_VIEWS = 256

#: Block length above which blocks are copied one slice each instead of by one fancy index.
LOOP_ABOVE = 16 << 10


class HostStage:
    """Gathers and scatters blocks of one arena, and keeps each launch thread's host buffers.

    Args:
        arena: The arena as a flat ``uint8`` array (the memory behind ``host``).
        host: The same memory as a torch tensor.
    """

    def __init__(self, arena: np.ndarray, host: Any) -> None:
        self.arena = arena
        self.host = host
        self._windows: dict[int, np.ndarray] = {}
        self._local = threading.local()

    def windows(self, length: int) -> np.ndarray:
        """``(size - length + 1, length)`` view of the arena: row ``o`` is the ``length`` bytes at offset ``o``."""
        view = self._windows.get(length)
        if view is None:
            size = len(self.arena)
            view = as_strided(self.arena, shape=(max(size - length + 1, 0), length), strides=(1, 1))
            self._windows[length] = view
        return view

    def views(self, key: Hashable, make: Callable[..., Any], *args: Any) -> Any:
        """This thread's ``make(*args)`` for ``key`` (views of its buffers for one batch shape), made once.

        Batches of the same shape reuse the same views (and tensors), so they make no torch views; the
        cache is dropped when a buffer grows or it holds :data:`MAX_VIEWS` shapes.
        """
        cache: dict[Hashable, Any] = self._local.__dict__.setdefault("views", {})
        got = cache.get(key)
        if got is None:
            if len(cache) >= MAX_VIEWS:
                cache.clear()
            got = cache[key] = make(*args)
        return got

    def buffer(self, which: str, nbytes: int, device: Any, *, on_device: bool = False) -> Any:
        """This thread's buffer ``which`` of at least ``nbytes``, kept and grown by doubling.

        On the host (page-locked for a CUDA ``device``), or with ``on_device`` on ``device`` itself.
        """
        import torch

        bufs: dict[str, Any] = self._local.__dict__.setdefault("bufs", {})
        buf = bufs.get(which)
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (buf.numel() if buf is not None else 0), 1 << 16)
            if on_device:
                buf = bufs[which] = torch.empty(size, dtype=torch.uint8, device=device)
            else:
                cuda = torch.device(device).type == "cuda"
                buf = bufs[which] = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
            self._local.__dict__.setdefault("views", {}).clear()  # views of the old buffer keep it alive while used
        return buf

    def gather(self, out: np.ndarray, src: Any, length: int, *, tail: bool = False) -> None:
        """``out[i] = arena[src[i] : src[i] + length]`` for each row (``src``: a list or an array of offsets).

        ``tail``: some rows may run past the arena's end; their bytes past it are zero.
        """
        if tail:
            src = np.asarray(src, dtype=np.int64)
            past = src + length > len(self.arena)
            for i in np.flatnonzero(past).tolist():  # a stored block at the arena's very end: row by row
                s = int(src[i])
                m = max(0, len(self.arena) - s)
                out[i, :m] = self.arena[s:]
                out[i, m:] = 0
            keep = np.flatnonzero(~past)
            if len(keep):
                out[keep] = self.windows(length)[src[keep]]
        elif length > LOOP_ABOVE:
            arena = self.arena
            for i, s in enumerate(src.tolist() if isinstance(src, np.ndarray) else src):
                out[i] = arena[s : s + length]
        else:
            out[...] = self.windows(length)[src]

    def scatter(self, rows: np.ndarray, dst: Any, length: int) -> None:
        """``arena[dst[i] : dst[i] + length] = rows[i]`` for each row (every destination inside the arena)."""
        if length > LOOP_ABOVE:
            arena = self.arena
            for i, d in enumerate(dst.tolist() if isinstance(dst, np.ndarray) else dst):
                arena[d : d + length] = rows[i]
        else:
            self.windows(length)[dst] = rows
