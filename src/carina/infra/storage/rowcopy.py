"""Moving a batch's blocks between the arena and device rows in one copy each way.

The blocks of one batch come from many requests, so they lie in many places
of the arena (one *run* of back-to-back blocks per request slot). Copying each
run on its own costs one copy call per request each way, and at 4 KiB per
request those calls, not the bytes, set the pace. :class:`RowMover` gathers
every run into one staging buffer on the host (page-locked when the rows live
on a GPU) and uploads it in one copy; on the way back it downloads all rows in
one copy and scatters them into the arena once the stream has finished. A
batch of a single run skips the staging and copies straight from and into the
(registered) arena. On the CPU the rows are host memory already, so the runs
are gathered straight into them::

    mover = RowMover(arena_np)
    mover.upload(rows, runs, length)              # rows: (n, length) on the device
    scatter = mover.download(blocks, runs, length)
    ...synchronise the stream...
    scatter()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Run", "RowMover", "runs_of"]

#: ``(first row, rows, source offset, destination offset)`` of blocks that lie back to back.
Run = tuple[int, int, int, int]


def runs_of(src: np.ndarray, dst: np.ndarray, length: int) -> list[Run]:
    """Cut a group of blocks into runs contiguous in both source and destination."""
    cut = np.flatnonzero((src[1:] != src[:-1] + length) | (dst[1:] != dst[:-1] + length)) + 1
    starts = np.concatenate(([0], cut))
    counts = np.diff(np.concatenate((starts, [len(src)])))
    return list(zip(starts.tolist(), counts.tolist(), src[starts].tolist(), dst[starts].tolist(), strict=True))


def _nothing() -> None:
    return None


class RowMover:
    """Gathers runs of arena blocks into device rows and scatters rows back, one copy call each way.

    Args:
        arena: The arena as a flat ``uint8`` array (the memory behind ``host``).
        host: The same memory as a torch tensor (the copies' source and target).

    Attributes:
        copies: Host/device copy calls issued (a test and a benchmark read it).
    """

    def __init__(self, arena: np.ndarray, host: Any) -> None:
        self.arena = arena
        self.host = host
        self.copies = 0
        self._local = threading.local()  # staging buffers per launch thread: each thread's copies are its own

    def _stage(self, which: str, nbytes: int, device: Any) -> Any:
        """A host buffer of at least ``nbytes`` (page-locked for CUDA rows), kept and grown by doubling."""
        import torch

        staging: dict[tuple[str, str], Any] = self._local.__dict__.setdefault("staging", {})
        key = (which, str(device))
        buf = staging.get(key)
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (buf.numel() if buf is not None else 0), 1 << 20)
            buf = staging[key] = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
        return buf

    def _gather(self, out: np.ndarray, runs: Sequence[Run], length: int) -> None:
        """Copy each run's blocks into ``out`` at its rows (zero past the end of the arena)."""
        size = len(self.arena)
        for r, k, src, _ in runs:
            n = k * length
            m = max(0, min(n, size - src))
            out[r * length : r * length + m] = self.arena[src : src + m]
            if m < n:
                out[r * length + m : r * length + n] = 0

    def upload(self, rows: Any, runs: Sequence[Run], length: int) -> None:
        """Fill ``rows`` (``(n, length)``, on any device) with the runs' source blocks."""
        total = rows.shape[0] * length
        if rows.device.type == "cpu":
            self._gather(rows.view(-1).numpy(), runs, length)
            return
        _, k, src, _ = runs[0]
        if len(runs) == 1 and src + total <= len(self.arena):
            rows.copy_(self.host[src : src + total].view(k, length), non_blocking=True)
        else:
            staging = self._stage("up", total, rows.device)
            self._gather(staging.numpy(), runs, length)
            rows.view(-1).copy_(staging[:total], non_blocking=True)
        self.copies += 1

    def download(self, blocks: Any, runs: Sequence[Run], length: int) -> Callable[[], None]:
        """Start copying ``blocks`` back; the returned call puts them in the arena once the copy is done.

        Call it only after the stream the copy was queued on has finished (or at once on the CPU).
        """
        total = blocks.shape[0] * length
        if blocks.device.type != "cpu" and len(runs) == 1:
            _, k, _, dst = runs[0]
            self.host[dst : dst + total].view(k, length).copy_(blocks, non_blocking=True)
            self.copies += 1
            return _nothing
        if blocks.device.type == "cpu":
            flat = np.ascontiguousarray(blocks.numpy()).reshape(-1)
        else:
            staging = self._stage("down", total, blocks.device)
            staging[:total].view(blocks.shape[0], length).copy_(blocks, non_blocking=True)
            self.copies += 1
            flat = staging.numpy()

        def scatter() -> None:
            for r, k, _, dst in runs:
                self.arena[dst : dst + k * length] = flat[r * length : (r + k) * length]

        return scatter
