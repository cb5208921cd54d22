"""IO backends, registered lazily by name, and ``auto`` selection.

Priority for ``auto``: ``uring`` (batched submission through io_uring), then
``posix`` (thread pool). ``kvikio`` and ``null`` are used only when named.
"""

from __future__ import annotations

from typing import Any

from carina.core.backend import Backend, Selection, select_backend
from carina.core.errors import BackendUnavailable
from carina.core.registry import Registry
from carina.io.backends.base import IOBackend

__all__ = ["AUTO_ORDER", "BACKENDS", "IOBackend", "build_backend", "choose_backend"]

BACKENDS = Registry("io.backend")
BACKENDS.register("uring", "carina.io.backends.uring:UringBackend", doc="io_uring through raw syscalls (ctypes)")
BACKENDS.register("posix", "carina.io.backends.posix:PosixBackend", doc="thread pool over preadv/pwritev")
BACKENDS.register("kvikio", "carina.io.backends.kvikio:KvikioBackend", doc="NVIDIA KvikIO (GDS or compat mode)")
BACKENDS.register("null", "carina.io.backends.null:NullBackend", doc="completes at once, touches nothing")

AUTO_ORDER = ("uring", "posix")  # kvikio only when named: for host memory uring is faster


class Candidate(Backend):
    """A backend class under consideration, not started: its name and its reasons."""

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]
        self.cls: type[IOBackend] | None = None
        try:
            self.cls = BACKENDS.load(name)
            self.reasons = self.cls.probe_reasons()
        except BackendUnavailable as exc:
            self.reasons = [str(exc)]

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Reasons found when the candidate was probed."""
        return self.reasons


def choose_backend(name: str = "auto") -> Selection[Candidate]:
    """Say which backend ``name`` resolves to here and why the others were skipped.

    Raises:
        BackendUnavailable: The named backend (or, for ``auto``, every one) cannot run.
    """
    order = AUTO_ORDER if name == "auto" else (name,)
    return select_backend([Candidate(n) for n in order])


def build_backend(
    name: str = "auto", *, queue_depth: int = 64, workers: int = 0
) -> tuple[IOBackend, Selection[Candidate]]:
    """Start the backend ``name`` resolves to; return it and the selection record."""
    selection = choose_backend(name)
    cls = selection.backend.cls
    assert cls is not None
    return cls(queue_depth=queue_depth, workers=workers), selection
