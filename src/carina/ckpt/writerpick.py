"""The writer a :class:`~carina.ckpt.Checkpointer` saves through, by :class:`~carina.ckpt.writers.WriterKind`."""

from __future__ import annotations

from carina.ckpt.forkwrite import ForkWriter
from carina.ckpt.procwrite import ProcessWriter
from carina.ckpt.writers import SyncWriter, ThreadWriter, Writer, WriterKind

__all__ = ["make_writer"]


def make_writer(kind: WriterKind, nice: int = 0) -> Writer:
    """A writer of ``kind`` that adds ``nice`` to its own niceness (not the ``sync`` writer's)."""
    classes: dict[WriterKind, type[Writer]] = {
        WriterKind.FORK: ForkWriter,
        WriterKind.PROCESS: ProcessWriter,
        WriterKind.THREAD: ThreadWriter,
        WriterKind.SYNC: SyncWriter,
    }
    return classes[kind](nice)
