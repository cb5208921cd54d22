"""The ``null`` backend: completes every op at once without touching the file.

Measures the engine's own overhead (submission, coalescing, futures) with no
device underneath. Reads leave the destination untouched; writes are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from carina.io._future import Op
from carina.io._gather import GatherOp
from carina.io.backends.base import IOBackend

__all__ = ["NullBackend"]


class NullBackend(IOBackend):
    """Reports every op as fully done, inline, in the submitting thread."""

    name: ClassVar[str] = "null"
    capabilities: ClassVar[frozenset[str]] = frozenset({"vectored", "batched_submit"})

    def _submit(self, ops: Sequence[Op]) -> None:
        for op in ops:
            op.finish(op.nbytes)

    def _submit_gather(self, gather: GatherOp) -> None:
        gather.results[:] = gather.lengths
        gather.finish()

    def _close(self) -> None:
        pass
