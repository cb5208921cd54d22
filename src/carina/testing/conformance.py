"""The conformance-suite pattern every carina interface follows.

An interface (a :class:`~carina.core.backend.Backend` subclass) gets a suite
here: a plain class of ``test_*`` methods over a ``make_backend`` fixture.
Each backend's tests subclass the suite and provide the fixture, so every
backend is held to the same contract::

    # tests/io/test_posix.py
    class TestPosix(IOBackendTests):
        @pytest.fixture
        def backend(self):
            return PosixBackend()

:class:`BackendTests` is the base all suites extend: it checks what every
backend owes (a name, capabilities, honest reasons). :class:`NullBackend` is
the smallest backend that passes it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from carina.core.backend import Backend, select_backend

__all__ = ["BackendTests", "NullBackend"]


class NullBackend(Backend):
    """A backend that serves every request and does nothing: the pattern's minimum."""

    name: ClassVar[str] = "null"
    capabilities: ClassVar[frozenset[str]] = frozenset({"noop"})

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Never any reason: the null backend accepts everything."""
        return []


class BackendTests:
    """What every backend owes. Subclass it and define a ``backend`` fixture.

    Suites for concrete interfaces (``IOBackendTests``, ``FeatureStoreTests``)
    subclass this and add their own ``test_*`` methods.
    """

    request: Any = None  # a request the backend under test should be able to serve

    def test_has_registry_name(self, backend: Backend) -> None:
        assert backend.name and backend.name != "?"
        assert backend.name == backend.name.strip().lower()

    def test_capabilities_are_strings(self, backend: Backend) -> None:
        assert all(isinstance(c, str) and c for c in backend.capabilities)

    def test_reasons_are_sentences(self, backend: Backend) -> None:
        reasons = backend.unsupported_reasons(self.request)
        assert isinstance(reasons, list)
        assert all(isinstance(r, str) and r.strip() for r in reasons)

    def test_supports_agrees_with_reasons(self, backend: Backend) -> None:
        assert backend.supports(self.request) == (not backend.unsupported_reasons(self.request))

    def test_selectable_when_supported(self, backend: Backend) -> None:
        if backend.supports(self.request):
            assert select_backend([backend], self.request).backend is backend
