"""Futures the engine returns and the operations backends execute."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IOFuture", "Op", "OpKind", "Request", "in_completion_context"]


class OpKind(enum.Enum):
    """Direction of an operation."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class Request:
    """What a caller asked for; attached to its future and to errors about it."""

    kind: OpKind
    path: str
    offset: int
    nbytes: int

    def __str__(self) -> str:
        return f"{self.kind.value} {self.nbytes} B at {self.offset} of {self.path}"


class IOFuture(Future[int]):
    """The outcome of one read or write: the number of bytes moved.

    A ``concurrent.futures.Future``: ``result(timeout)``, ``done()``,
    ``add_done_callback(fn)``, and :meth:`wait`, its alias. A failed request
    raises its error (an ``IOEngineError`` naming path and offset) there.

    Attributes:
        request: What was asked for.
    """

    def __init__(self, request: Request) -> None:
        super().__init__()
        self.request = request
        self.cuda_event: Any = None

    def result(self, timeout: float | None = None) -> int:
        """Block until done; return the bytes moved or raise the request's error.

        Raises:
            IOEngineError: Called from a completion callback on a request that is
                not done yet (it would wait on the thread that must finish it).
        """
        if in_completion_context() and not self.done():
            from carina.core.errors import IOEngineError

            raise IOEngineError(f"waiting inside a completion callback would deadlock: {self.request}")
        return super().result(timeout)

    def wait(self, timeout: float | None = None) -> int:
        """Block until done; return the bytes moved or raise the request's error."""
        return self.result(timeout)

    def stream_wait(self, stream: Any = None) -> None:
        """Make a CUDA stream wait for this request's data.

        The host waits until the file IO is done (not for the copy to the GPU):
        for a GPU destination the engine then has recorded a CUDA event after
        the host-to-GPU copy on its copy stream, and ``stream`` (default: the
        current one) waits on that event on the device. For CPU buffers the data
        is in place once the future is done. (Releasing the stream before the IO
        finishes, with a stream memory operation, is not built yet.)
        """
        self.result()
        if self.cuda_event is not None:
            import torch

            (stream or torch.cuda.current_stream()).wait_event(self.cuda_event)


@dataclass(eq=False)
class Op:
    """One system-level operation a backend performs: a vectored pread/pwrite.

    Attributes:
        kind: Read or write.
        fd: Descriptor to use.
        offset: File offset of the first byte.
        views: Memory to read into / write from, in file order.
        on_done: Called once with the bytes moved or the ``OSError``.
    """

    kind: OpKind
    fd: int
    offset: int
    views: list[memoryview]
    on_done: Callable[[Op, int | OSError], None]
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(v.nbytes for v in self.views)

    def finish(self, result: int | OSError) -> None:
        """Report the outcome (called by the backend, in completion context)."""
        before = getattr(_CONTEXT, "active", False)
        _CONTEXT.active = True
        try:
            self.on_done(self, result)
        finally:
            _CONTEXT.active = before


_CONTEXT = threading.local()


def in_completion_context() -> bool:
    """True on a backend thread while it reports completions (never block there)."""
    return bool(getattr(_CONTEXT, "active", False))
