"""The engine's typed config and the choices it names."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from carina.core import flags
from carina.core.config import Config, require

__all__ = ["BACKEND_NAMES", "Direct", "IOConfig"]

#: Backend names a config may ask for; ``auto`` picks the best capable one.
BACKEND_NAMES = ("auto", "uring", "posix", "kvikio", "null")

QUEUE_DEPTH = flags.define("CARINA_IO_QUEUE_DEPTH", int, 64, "default queue depth of carina.io engines")
WORKERS = flags.define(
    "CARINA_IO_WORKERS", int, 0, "threads of the posix/kvikio IO backends (0: one per queue slot, at most 128)"
)


class Direct(enum.Enum):
    """Whether files are opened with ``O_DIRECT`` (bypassing the page cache).

    ``AUTO`` uses O_DIRECT where the file system allows it and falls back to
    buffered IO for the rest (misaligned writes, file systems that refuse it).
    ``ON`` insists: opening fails where O_DIRECT is refused, and writes whose
    offset or length is not aligned are refused with ``AlignmentError``.
    ``OFF`` always goes through the page cache.
    """

    AUTO = "auto"
    ON = "on"
    OFF = "off"


@dataclass(kw_only=True)
class IOConfig(Config):
    """Settings of an :class:`~carina.io.IOEngine`.

    Attributes:
        backend: ``auto``, ``uring``, ``posix``, ``kvikio`` or ``null``.
        queue_depth: Most operations in flight; submitting more blocks (backpressure).
        workers: Threads of the ``posix`` and ``kvikio`` backends, each with one request in flight;
            0 (the default) runs one per queue slot, at most 128, so ``queue_depth`` requests are in flight.
        direct: O_DIRECT policy, see :class:`Direct`.
        alignment: Byte alignment O_DIRECT requests need (offset, length, address).
        coalesce_gap: ``read_batch`` merges requests separated by at most this many
            bytes (the gap is read and thrown away); 0 merges only adjacent ones.
        max_coalesce: Largest merged request in bytes.
        bounce_bytes: Size of the pool of aligned bounce buffers for misaligned
            O_DIRECT requests (and pinned staging for GPU destinations).
    """

    backend: str = "auto"
    queue_depth: int = field(default_factory=QUEUE_DEPTH.get)
    workers: int = field(default_factory=WORKERS.get)
    direct: Direct = Direct.AUTO
    alignment: int = 4096
    coalesce_gap: int = 0
    max_coalesce: int = 1 << 20
    bounce_bytes: int = 16 << 20

    def validate(self) -> None:
        """Check ranges and the backend name."""
        require(
            self.backend in BACKEND_NAMES, f"unknown backend {self.backend!r} (one of {BACKEND_NAMES})", key="backend"
        )
        require(1 <= self.queue_depth <= 4096, "queue_depth must be in 1..4096", key="queue_depth")
        require(0 <= self.workers <= 256, "workers must be in 0..256 (0: one per queue slot)", key="workers")
        require(
            self.alignment >= 512 and self.alignment & (self.alignment - 1) == 0,
            "alignment must be a power of two >= 512",
            key="alignment",
        )
        require(
            0 <= self.coalesce_gap <= self.max_coalesce, "coalesce_gap must be in 0..max_coalesce", key="coalesce_gap"
        )
        require(
            self.max_coalesce >= self.alignment, "max_coalesce must be at least one aligned block", key="max_coalesce"
        )
        require(self.bounce_bytes >= 0, "bounce_bytes must be >= 0", key="bounce_bytes")
