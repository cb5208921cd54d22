"""Lazy registries of backends and plugins, keyed by name.

A registry maps names to ``module:attribute`` strings; nothing is imported until
:meth:`Registry.load` asks for it. An import failure becomes
:class:`~carina.core.errors.BackendUnavailable` naming the extra to install.
Third-party packages add entries through the ``carina.plugins`` entry-point
group, with names of the form ``<registry>.<name>`` (``io.backend.mine``)::

    BACKENDS = Registry("io.backend")
    BACKENDS.register("posix", "carina.io.backends.posix:PosixBackend")
    BACKENDS.register("gds", "carina.io.backends.gds:GdsBackend", extra="gpu")
    cls = BACKENDS.load("posix")
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from types import MappingProxyType
from typing import Any

from carina.core.errors import BackendUnavailable, ConfigError

__all__ = ["ENTRY_POINT_GROUP", "Entry", "Registry", "install_hint"]

ENTRY_POINT_GROUP = "carina.plugins"


def install_hint(extra: str | None) -> str:
    """The pip command that installs an extra (or carina itself)."""
    return f"pip install 'carina[{extra}]'" if extra else "pip install carina"


@dataclass(frozen=True)
class Entry:
    """One registered implementation.

    Attributes:
        name: Key in its registry.
        target: ``"package.module:attribute"``.
        extra: The carina extra that provides its dependencies, if any.
        doc: One line shown in listings.
    """

    name: str
    target: str
    extra: str | None = None
    doc: str = ""


class Registry:
    """A named, lazily loaded set of implementations of one interface."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, Any] = {}
        self._plugins_read = False

    def register(self, name: str, target: str, *, extra: str | None = None, doc: str = "") -> None:
        """Add ``name``; ``target`` is ``module:attribute`` and is not imported now."""
        if ":" not in target:
            raise ConfigError("target must be 'module:attribute'", key=f"{self.kind}.{name}")
        if name in self._entries and self._entries[name].target != target:
            raise ConfigError("name already registered to another target", key=f"{self.kind}.{name}")
        self._entries[name] = Entry(name=name, target=target, extra=extra, doc=doc)

    def entries(self) -> Mapping[str, Entry]:
        """Read-only view of all entries, entry-point plugins included."""
        self._read_plugins()
        return MappingProxyType(self._entries)

    def names(self) -> list[str]:
        """Registered names in registration order."""
        return list(self.entries())

    def load(self, name: str) -> Any:
        """Import and return the object registered as ``name``.

        Raises:
            ConfigError: ``name`` is not registered.
            BackendUnavailable: Importing it failed; the message names the fix.
        """
        if name in self._loaded:
            return self._loaded[name]
        entry = self.entries().get(name)
        if entry is None:
            known = ", ".join(self.names()) or "none"
            raise ConfigError(f"no {self.kind} named {name!r} (known: {known})", key=name)
        module_name, _, attr = entry.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except ImportError as exc:
            raise BackendUnavailable(
                f"{self.kind} {name!r} needs {exc.name or 'a missing package'}: run {install_hint(entry.extra)}",
                key=name,
            ) from exc
        except AttributeError as exc:
            raise BackendUnavailable(f"{entry.target} does not exist", key=name) from exc
        self._loaded[name] = obj
        return obj

    def _read_plugins(self) -> None:
        if self._plugins_read:
            return
        self._plugins_read = True
        prefix = self.kind + "."
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name.startswith(prefix):
                self.register(ep.name[len(prefix) :], ep.value, doc=f"plugin from {ep.dist.name if ep.dist else '?'}")
