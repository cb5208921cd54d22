"""Tuning flags: the only place carina reads ``CARINA_*`` environment variables.

A flag is typed and documented where it is defined. Its value comes, in order,
from an :func:`override` in effect, the environment, or its default. Flags only
tune; anything a flag can do, a config can do too.

    from carina.core import flags

    IO_THREADS = flags.define("CARINA_IO_THREADS", int, 4, "worker threads of the posix IO backend")
    IO_THREADS.get()                      # 4, or $CARINA_IO_THREADS
    with flags.override(CARINA_IO_THREADS=8):
        IO_THREADS.get()                  # 8

``carina doctor --json`` lists every flag with its value and source.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from carina.core.errors import ConfigError

__all__ = ["Flag", "all_flags", "define", "override"]

T = TypeVar("T", bool, int, float, str)

_OVERRIDES: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "carina_flag_overrides", default=MappingProxyType({})
)
_FLAGS: dict[str, Flag[Any]] = {}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Flag(Generic[T]):
    """One typed tuning flag read from the environment.

    Attributes:
        name: The environment variable, ``CARINA_`` prefixed.
        type: ``bool``, ``int``, ``float`` or ``str``.
        default: The value when neither an override nor the environment sets it.
        doc: One line saying what it tunes.
    """

    name: str
    type: type[T]
    default: T
    doc: str

    def get(self) -> T:
        """Return the flag's current value (override, environment, default)."""
        overrides = _OVERRIDES.get()
        if self.name in overrides:
            return overrides[self.name]
        raw = os.environ.get(self.name)
        return self.default if raw is None else self.parse(raw)

    def source(self) -> str:
        """Where the current value comes from: ``override``, ``env`` or ``default``."""
        if self.name in _OVERRIDES.get():
            return "override"
        return "env" if self.name in os.environ else "default"

    def parse(self, raw: str) -> T:
        """Parse a raw string into the flag's type; raise ConfigError if it cannot."""
        try:
            if self.type is bool:
                low = raw.strip().lower()
                if low not in _TRUE | _FALSE:
                    raise ValueError(raw)
                return low in _TRUE
            return self.type(raw)
        except ValueError:
            raise ConfigError(f"{raw!r} is not a valid {self.type.__name__}", key=self.name) from None


def define(name: str, type_: type[T], default: T, doc: str) -> Flag[T]:
    """Declare a flag. Defining the same name twice with another type is an error."""
    if not name.startswith("CARINA_"):
        raise ConfigError("flag names start with CARINA_", key=name)
    if type_ not in (bool, int, float, str):
        raise ConfigError(f"unsupported flag type {type_!r}", key=name)
    existing = _FLAGS.get(name)
    if existing is not None:
        if existing.type is not type_ or existing.default != default:
            raise ConfigError("flag defined twice with different type or default", key=name)
        return existing
    flag = Flag(name=name, type=type_, default=default, doc=doc)
    _FLAGS[name] = flag
    return flag


def all_flags() -> Mapping[str, Flag[Any]]:
    """A read-only view of every flag defined so far."""
    return MappingProxyType(_FLAGS)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set flags for the current context (thread/task), e.g. in tests.

    Raises:
        ConfigError: An unknown flag name or a value of the wrong type.
    """
    for name, value in values.items():
        flag = _FLAGS.get(name)
        if flag is None:
            raise ConfigError("unknown flag", key=name)
        if not isinstance(value, flag.type) or (flag.type is not bool and isinstance(value, bool)):
            raise ConfigError(f"{value!r} is not a {flag.type.__name__}", key=name)
    token = _OVERRIDES.set(MappingProxyType({**_OVERRIDES.get(), **values}))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


# -- flags of the core -------------------------------------------------------
LOG_LEVEL = define("CARINA_LOG_LEVEL", str, "WARNING", "logging level of the carina logger")
RESULTS_DIR = define(
    "CARINA_RESULTS_DIR", str, "", "where benchmarks write records (default benchmarks/results/<machine>)"
)
SOURCE_COMMIT = define(
    "CARINA_SOURCE_COMMIT",
    str,
    "",
    "the commit a copied working tree came from (a device machine's copy, whose .git may be older); "
    "records then name it as git_sha and keep what git said as git_sha_seen",
)
