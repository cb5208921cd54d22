"""How much of a staged arena is final: the process writer's copied-prefix watermark in shared memory.

With lent host state (:mod:`carina.ckpt.hostcopy`) the ``process`` writer need not wait for every lent
copy before it starts: the trainer publishes, per arena, the *frontier*, the offset below which every
byte of the image is final (the header and the tensors copied in ``save()`` are; a lent slot is once
its copy finished, and the frontier is the start of the first lent slot not yet copied, in offset
order, which is the background thread's order). The writer process reads it before it writes or
checksums any byte (:meth:`Progress.gate`), so it never touches one that is not copied yet. A failed
copy sets ``failed``: the frontier stops below that slot and the gate raises, so nothing commits.

One entry per arena index: ``[seq, frontier, failed, passed]`` (int64), under one lock (the lock's
semaphore operations also order the trainer's copies before the frontier it publishes after them).
``seq`` names the save an entry serves; publishers of an older save (a copy thread still running
after its save failed) change nothing. ``passed`` is the furthest offset the writer asked for: a
test's evidence of the overlap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from carina.core.errors import CheckpointError

__all__ = ["ENTRIES", "Progress"]

#: Arenas with a watermark entry; a snapshot in any other arena is sent only once fully copied.
ENTRIES = 8
_SEQ, _FRONTIER, _FAILED, _PASSED = range(4)
_POLL_S = 0.001


class Progress:
    """The watermarks of :data:`ENTRIES` arenas, shared with the writer process (pass it at spawn).

    Args:
        ctx: The multiprocessing context the writer process is started with.
    """

    def __init__(self, ctx: Any) -> None:
        self._array = ctx.Array("q", 4 * ENTRIES)

    def reset(self, arena: int, seq: int, frontier: int) -> None:
        """Make ``arena``'s entry serve save ``seq``, final below ``frontier`` (before the job is sent)."""
        with self._array.get_lock():
            base = 4 * arena
            self._array[base : base + 4] = [seq, frontier, 0, 0]

    def publish(self, arena: int, seq: int, frontier: int, failed: bool) -> None:
        """Raise ``arena``'s frontier (never lowers it) or mark it failed, if the entry still serves ``seq``."""
        with self._array.get_lock():
            base = 4 * arena
            if self._array[base + _SEQ] != seq:
                return
            self._array[base + _FRONTIER] = max(self._array[base + _FRONTIER], frontier)
            if failed:
                self._array[base + _FAILED] = 1

    def passed(self, arena: int) -> int:
        """The furthest offset the writer has asked for in ``arena`` (for tests)."""
        with self._array.get_lock():
            return int(self._array[4 * arena + _PASSED])

    def gate(self, arena: int, seq: int, parent: int) -> Callable[[int], int]:
        """The writer process's wait: ``gate(n)`` returns the frontier once it is at least ``n``.

        Args:
            arena: The entry to read.
            seq: The save the entry must serve.
            parent: The trainer's process id (the gate gives up when the trainer is gone).

        Raises:
            CheckpointError: (from ``gate(n)``) a copy failed, the entry serves another save, or the
                trainer exited.
        """
        base = 4 * arena

        def wait(n: int) -> int:
            while True:
                with self._array.get_lock():
                    entry = self._array[base : base + 4]
                    if entry[_SEQ] == seq and entry[_FRONTIER] >= n and not entry[_FAILED]:
                        self._array[base + _PASSED] = max(entry[_PASSED], n)
                        return int(entry[_FRONTIER])
                if entry[_FAILED]:
                    raise CheckpointError("the trainer's snapshot copy failed: this save is not written")
                if entry[_SEQ] != seq:
                    raise CheckpointError(f"arena {arena}'s watermark serves save {entry[_SEQ]}, not {seq}")
                if os.getppid() != parent:
                    raise CheckpointError("the trainer exited before its snapshot was copied")
                time.sleep(_POLL_S)

        return wait
