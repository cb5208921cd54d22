"""Open files: one buffered descriptor always, one O_DIRECT descriptor where allowed."""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from carina.core.errors import ConfigError, DeviceFull, IOEngineError
from carina.io._config import Direct

__all__ = ["FileHandle", "Mode", "open_handle"]

log = logging.getLogger("carina.io")

Mode = str  # "r" | "w" | "rw"
_FLAGS = {"r": os.O_RDONLY, "w": os.O_RDWR | os.O_CREAT | os.O_TRUNC, "rw": os.O_RDWR | os.O_CREAT}
_O_DIRECT = getattr(os, "O_DIRECT", 0)


@dataclass(eq=False)
class FileHandle:
    """A file opened by an engine.

    Attributes:
        path: The file's path.
        mode: ``r``, ``w`` or ``rw``.
        size: Bytes in the file as far as this handle knows (grows with writes).
        direct: Whether an O_DIRECT descriptor is open (aligned requests use it).
        alignment: Alignment O_DIRECT requests need, in bytes.
    """

    path: Path
    mode: Mode
    size: int
    direct: bool
    alignment: int
    fd: int = field(repr=False)
    direct_fd: int = field(default=-1, repr=False)
    closed: bool = False
    why_buffered: str = ""
    _inflight: int = field(default=0, repr=False)
    _idle: threading.Condition = field(default_factory=threading.Condition, repr=False)

    @property
    def readable(self) -> bool:
        """Whether reads are allowed (every mode allows them; ``w`` is read-write too)."""
        return True

    @property
    def writable(self) -> bool:
        """Whether writes are allowed."""
        return self.mode != "r"

    def grow(self, end: int) -> None:
        """Record that bytes up to ``end`` now exist."""
        with self._idle:
            self.size = max(self.size, end)

    def begin(self) -> None:
        """Count one operation in flight on this handle."""
        with self._idle:
            self._inflight += 1

    def end(self) -> None:
        """Count one operation finished."""
        with self._idle:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no operation is in flight on this handle."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def release(self) -> None:
        """Close the descriptors (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for fd in (self.fd, self.direct_fd):
            if fd >= 0:
                os.close(fd)


def open_handle(
    path: str | os.PathLike[str], mode: Mode, *, size: int | None, direct: Direct, alignment: int
) -> FileHandle:
    """Open ``path`` for the engine.

    Args:
        path: File to open; ``w`` and ``rw`` create it.
        mode: ``r`` (must exist), ``w`` (create or truncate), ``rw`` (create, keep contents).
        size: For ``w``/``rw``, preallocate this many bytes; for ``r``, the file must
            hold at least this many.
        direct: O_DIRECT policy.
        alignment: O_DIRECT alignment in bytes.

    Raises:
        ConfigError: Unknown mode or negative size.
        DeviceFull: Preallocation ran out of space.
        IOEngineError: The file cannot be opened (or O_DIRECT is refused under ``ON``).
    """
    if mode not in _FLAGS:
        raise ConfigError(f"mode must be 'r', 'w' or 'rw', not {mode!r}", key="mode")
    if size is not None and size < 0:
        raise ConfigError("size must be >= 0", key="size")
    where = Path(path)
    try:
        fd = os.open(where, _FLAGS[mode] | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise IOEngineError(f"cannot open file: {exc.strerror}", path=str(where)) from exc
    try:
        actual = os.fstat(fd).st_size
        if size is not None and mode != "r" and size > actual:
            _preallocate(fd, size, where)
            actual = size
        if size is not None and mode == "r" and actual < size:
            raise IOEngineError(f"file holds {actual} bytes, fewer than size={size}", path=str(where))
        direct_fd, why = _open_direct(where, mode, direct)
    except BaseException:
        os.close(fd)
        raise
    return FileHandle(
        path=where,
        mode=mode,
        size=actual,
        direct=direct_fd >= 0,
        alignment=alignment,
        fd=fd,
        direct_fd=direct_fd,
        why_buffered=why,
    )


def _preallocate(fd: int, size: int, where: Path) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            os.ftruncate(fd, os.fstat(fd).st_size)
            raise DeviceFull(f"cannot preallocate {size} bytes", path=str(where), offset=0) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise IOEngineError(f"cannot preallocate: {exc.strerror}", path=str(where)) from exc
        os.ftruncate(fd, size)


def _open_direct(where: Path, mode: Mode, direct: Direct) -> tuple[int, str]:
    """Open the O_DIRECT descriptor; return ``(-1, reason)`` when buffered IO is used."""
    if direct is Direct.OFF:
        return -1, "direct='off'"
    if not _O_DIRECT:
        why = "this platform has no O_DIRECT"
    else:
        flags = (os.O_RDONLY if mode == "r" else os.O_RDWR) | _O_DIRECT | os.O_CLOEXEC
        try:
            return os.open(where, flags), ""
        except OSError as exc:
            why = f"the file system refuses O_DIRECT: {exc.strerror}"
    if direct is Direct.ON:
        raise IOEngineError(f"direct='on' but {why}", path=str(where))
    log.warning("carina.io: buffered IO for %s (%s)", where, why)
    return -1, why
