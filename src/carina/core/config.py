"""Typed, validated, versioned component configs.

Every carina component owns a ``@dataclass(kw_only=True)`` subclass of
:class:`Config`. Values are checked against the field annotations when the
config is built, then the subclass's :meth:`Config.validate` checks the
relations between them. Configs round-trip through plain dicts, JSON and TOML;
unknown keys are rejected with the dotted path of the offending key, and every
serialised config records the version of its schema::

    @dataclass(kw_only=True)
    class ReaderConfig(Config):
        queue_depth: int = 32
        block_size: int = 1 << 20

        def validate(self) -> None:
            require(self.queue_depth > 0, "queue_depth must be positive", key="queue_depth")

    cfg = ReaderConfig.from_toml('queue_depth = 64\\n')
    assert ReaderConfig.from_dict(cfg.to_dict()) == cfg

Composite configs nest sub-configs as fields; they are never flattened.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from carina.core.errors import ConfigError

__all__ = ["VERSION_KEY", "Config", "choice", "require"]

#: Key under which a serialised config records its schema version.
VERSION_KEY = "config_version"


def require(condition: bool, message: str, *, key: str) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message, key=key)


E = TypeVar("E", bound=enum.Enum)


def choice(kind: type[E], value: str | E, *, key: str) -> E:
    """``value`` as a member of the enum ``kind`` (for CLI options); :class:`ConfigError` lists the choices."""
    member: E = _coerce_scalar(value, kind, key)
    return member


@dataclasses.dataclass(kw_only=True)
class Config:
    """Base of every carina config: typed, validated, versioned, serialisable.

    Subclasses are ``@dataclass(kw_only=True)`` and override :meth:`validate`.
    Bump :attr:`VERSION` when a field changes meaning and override
    :meth:`migrate` to read older records.
    """

    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        for field, hint in _hints(type(self)).items():
            setattr(self, field, _coerce(getattr(self, field), hint, field))
        self.validate()

    def validate(self) -> None:
        """Check relations between fields; raise :class:`ConfigError` on failure."""

    @classmethod
    def migrate(cls, data: dict[str, Any], from_version: int) -> dict[str, Any]:
        """Turn a record of an older schema version into the current one.

        Args:
            data: The record without its version key.
            from_version: The version the record was written with.

        Returns:
            The record in the current schema.

        Raises:
            ConfigError: No migration exists (the default).
        """
        raise ConfigError(
            f"{cls.__name__} cannot read version {from_version} (current is {cls.VERSION})",
            key=VERSION_KEY,
        )

    # -- dicts ---------------------------------------------------------------
    def to_dict(self, *, version: bool = True) -> dict[str, Any]:
        """Return a JSON-compatible dict; nested configs become nested dicts."""
        out: dict[str, Any] = {VERSION_KEY: self.VERSION} if version else {}
        for field in dataclasses.fields(self):
            out[field.name] = _dump(getattr(self, field.name))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "") -> Self:
        """Build from a dict, rejecting unknown keys and wrongly typed values.

        Args:
            data: As produced by :meth:`to_dict` (the version key is optional).
            where: Dotted prefix used in error keys (for nested configs).

        Raises:
            ConfigError: Unknown key, missing required key, bad type or value.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"expected a table for {cls.__name__}", key=where or "<root>")
        data = dict(data)
        version = data.pop(VERSION_KEY, cls.VERSION)
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError("config version must be an integer", key=_join(where, VERSION_KEY))
        if version > cls.VERSION:
            raise ConfigError(
                f"{cls.__name__} record has version {version}, newer than this carina ({cls.VERSION})",
                key=_join(where, VERSION_KEY),
            )
        if version < cls.VERSION:
            data = cls.migrate(data, version)
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown key {unknown[0]!r} for {cls.__name__} (known: {', '.join(sorted(names))})",
                key=_join(where, unknown[0]),
            )
        hints = _hints(cls)
        kwargs = {k: _load(v, hints[k], _join(where, k)) for k, v in data.items()}
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            if where and "key" in exc.context:
                exc.context["key"] = _join(where, str(exc.context["key"]))
            raise
        except TypeError as exc:  # missing required field
            raise ConfigError(f"{cls.__name__}: {exc}", key=where or "<root>") from exc

    # -- text formats --------------------------------------------------------
    def to_json(self) -> str:
        """Serialise to JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> Self:
        """Parse JSON text; see :meth:`from_dict`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc.msg}", key=f"line {exc.lineno}") from exc
        return cls.from_dict(data)

    def to_toml(self) -> str:
        """Serialise to TOML text (``None`` values are left out)."""
        import tomli_w

        return tomli_w.dumps(_drop_none(self.to_dict()))

    @classmethod
    def from_toml(cls, text: str) -> Self:
        """Parse TOML text; see :meth:`from_dict`."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML: {exc}", key="<root>") from exc
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write to ``path`` as TOML or JSON, chosen by its suffix."""
        path = Path(path)
        text = self.to_toml() if path.suffix == ".toml" else self.to_json()
        path.write_text(text)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a ``.toml`` or ``.json`` file written by :meth:`save` or by hand."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config: {exc.strerror}", key=str(path)) from exc
        return cls.from_toml(text) if path.suffix == ".toml" else cls.from_json(text)


# -- type handling -----------------------------------------------------------

_HINT_CACHE: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINT_CACHE:
        all_hints = typing.get_type_hints(cls)
        _HINT_CACHE[cls] = {f.name: all_hints[f.name] for f in dataclasses.fields(cls) if f.init}
    return _HINT_CACHE[cls]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _dump(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict(version=False)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    return value


def _load(value: Any, hint: Any, key: str) -> Any:
    """Turn serialised ``value`` into ``hint``'s type (nested configs, enums, paths)."""
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and issubclass(hint, Config):
        return hint.from_dict(value, where=key)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        if value is None:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _load(value, arg, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if errors else ConfigError("value does not match", key=key)
    if origin in (list, tuple) and isinstance(value, list):
        args = typing.get_args(hint)
        item = args[0] if args else Any
        loaded = [_load(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return loaded if origin is list else tuple(loaded)
    if origin is dict and isinstance(value, dict):
        args = typing.get_args(hint)
        item = args[1] if len(args) == 2 else Any
        return {k: _load(v, item, f"{key}.{k}") for k, v in value.items()}
    return _coerce(value, hint, key)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against ``hint``; convert the lossless cases (str->Path/Enum, int->float)."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{value!r} is not a {_name(hint)}", key=key)
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{value!r} is not one of {typing.get_args(hint)}", key=key)
        return value
    if origin in (list, tuple, dict):
        return _coerce_container(value, hint, origin, key)
    if isinstance(hint, type):
        return _coerce_scalar(value, hint, key)
    return value


def _coerce_container(value: Any, hint: Any, origin: Any, key: str) -> Any:
    args = typing.get_args(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{value!r} is not a {_name(hint)}", key=key)
        item = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, item, f"{key}.{k}") for k, v in value.items()}
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{value!r} is not a {_name(hint)}", key=key)
    item = args[0] if args else Any
    items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    return items if origin is list else tuple(items)


def _coerce_scalar(value: Any, hint: type, key: str) -> Any:
    if issubclass(hint, enum.Enum):
        if isinstance(value, hint):
            return value
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in hint)
            raise ConfigError(f"{value!r} is not one of {choices}", key=key) from None
    if issubclass(hint, Config):
        if not isinstance(value, hint):
            raise ConfigError(f"expected a {hint.__name__}", key=key)
        return value
    if hint is Path:
        if isinstance(value, str | Path):
            return Path(value)
        raise ConfigError(f"{value!r} is not a path", key=key)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{value!r} is a bool, not a {hint.__name__}", key=key)
    if not isinstance(value, hint):
        raise ConfigError(f"{value!r} is not a {hint.__name__}", key=key)
    return value


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
