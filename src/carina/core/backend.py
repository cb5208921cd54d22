"""The shape every carina backend takes: capabilities, reasons, auto selection.

A backend declares what it can do and, for a given request, why it cannot.
``select_backend`` walks candidates in priority order, returns the first one
that has no reasons against it, and records why the others were skipped, so
``auto`` is never a mystery::

    class PosixBackend(Backend):
        name = "posix"
        def unsupported_reasons(self, request): return []

    choice = select_backend([GdsBackend(), PosixBackend()], request)
    choice.backend.name      # "posix"
    choice.skipped           # {"gds": ["kvikio is not installed: pip install 'carina[gpu]'"]}

Interfaces built on this keep public methods that validate and call private
hooks (``_submit``, ``_poll``, ...) that subclasses fill.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from carina.core.errors import BackendUnavailable

__all__ = ["Backend", "Selection", "select_backend"]


class Backend(abc.ABC):
    """Base of every pluggable implementation.

    Attributes:
        name: Registry name.
        capabilities: Names of optional features this backend has.
    """

    name: ClassVar[str] = "?"
    capabilities: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Why this backend cannot serve ``request`` here; empty when it can."""

    def supports(self, request: Any = None) -> bool:
        """True when :meth:`unsupported_reasons` is empty."""
        return not self.unsupported_reasons(request)


B = TypeVar("B", bound=Backend)


@dataclass(frozen=True)
class Selection(Generic[B]):
    """The outcome of :func:`select_backend`."""

    backend: B
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def explain(self) -> str:
        """One line per skipped backend, then the chosen one."""
        lines = [f"skipped {n}: {'; '.join(r)}" for n, r in self.skipped.items()]
        return "\n".join([*lines, f"chose {self.backend.name}"])


def select_backend(candidates: Iterable[B], request: Any = None) -> Selection[B]:
    """Pick the first candidate with no reasons against ``request``.

    Raises:
        BackendUnavailable: None can serve it; the message lists every reason.
    """
    skipped: dict[str, list[str]] = {}
    for backend in candidates:
        reasons = backend.unsupported_reasons(request)
        if not reasons:
            return Selection(backend=backend, skipped=skipped)
        skipped[backend.name] = list(reasons)
    raise BackendUnavailable("no backend can serve this request: " + _format(skipped), request=repr(request)[:200])


def _format(skipped: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{name}: {', '.join(r)}" for name, r in skipped.items()) or "no candidates"
