"""Typed reading of model fields with errors that point at file:line.

Both YAML dialects read their values through these functions, so a bad probability
or a misspelt key is reported the same way in either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from carina.core.errors import ModelFormatError
from carina.security.risk.model import Link
from carina.security.risk.source import Located, LocatedDict, LocatedList, where_of

__all__ = [
    "fail",
    "read_impact",
    "read_link",
    "read_links",
    "read_mapping",
    "read_name",
    "read_names",
    "read_probability",
    "reject_unknown",
]


def fail(message: str, where: Located) -> ModelFormatError:
    """A :class:`ModelFormatError` located at ``where``."""
    return ModelFormatError(message, file=where.file, line=where.line)


def read_mapping(value: Any, what: str, where: Located) -> LocatedDict:
    """``value`` as a mapping, or an error naming ``what``."""
    if not isinstance(value, LocatedDict):
        raise fail(f"{what} must be a mapping, got {_kind(value)}", where_of(value, where))
    return value


def reject_unknown(data: LocatedDict, allowed: Iterable[str], what: str) -> None:
    """Fail on the first key of ``data`` that is not in ``allowed``."""
    known = set(allowed)
    for key in data:
        if key not in known:
            raise fail(f"unknown key {key!r} in {what} (expected one of {sorted(known)})", data.at(key))


def read_name(value: Any, what: str, where: Located) -> str:
    """A non-empty name without whitespace."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise fail(f"{what} must be a name, got {_kind(value)}", where_of(value, where))
    name = str(value)
    if not name or any(c.isspace() for c in name):
        raise fail(f"{what} {name!r} is not a valid name", where)
    return name


def read_names(value: Any, what: str, where: Located) -> tuple[str, ...]:
    """A name or a list of names."""
    if value is None:
        return ()
    if isinstance(value, list):
        items = value.item_where if isinstance(value, LocatedList) else [where] * len(value)
        return tuple(read_name(v, what, w) for v, w in zip(value, items, strict=True))
    return (read_name(value, what, where),)


def _number(value: Any, what: str, where: Located) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(f"{what} must be a number, got {_kind(value)}", where_of(value, where))
    number = float(value)
    if not math.isfinite(number):
        raise fail(f"{what} must be finite, got {value!r}", where)
    return number


def read_probability(value: Any, what: str, where: Located) -> float | None:
    """A probability in [0, 1], or ``None`` when absent."""
    if value is None:
        return None
    p = _number(value, what, where)
    if not 0.0 <= p <= 1.0:
        raise fail(f"{what} {value!r} is not a probability in [0, 1]", where)
    return p


def read_impact(value: Any, what: str, where: Located) -> float | None:
    """An impact score >= 0 (STRonG's tables give 1..4), or ``None`` when absent."""
    if value is None:
        return None
    x = _number(value, what, where)
    if x < 0.0:
        raise fail(f"{what} {value!r} must not be negative", where)
    return x


def read_link(value: Any, where: Located, *, dest_key: str, src_key: str, prob_key: str) -> Link:
    """A link written as a bare destination name or a mapping of the given keys."""
    if isinstance(value, str):
        return Link(dest=read_name(value, "link destination", where), where=where)
    data = read_mapping(value, "a link", where)
    reject_unknown(data, (dest_key, src_key, prob_key), "a link")
    if dest_key not in data:
        raise fail(f"link has no destination '{dest_key}'", data.where)
    src = read_name(data[src_key], "link source", data.at(src_key)) if src_key in data else None
    return Link(
        dest=read_name(data[dest_key], "link destination", data.at(dest_key)),
        src=src,
        probability=read_probability(data.get(prob_key), "link probability", data.at(prob_key)),
        where=data.where,
    )


def read_links(value: Any, where: Located, *, dest_key: str, src_key: str, prob_key: str) -> tuple[Link, ...]:
    """A list of links (``None`` is no links)."""
    if value is None:
        return ()
    if not isinstance(value, LocatedList):
        raise fail(f"links must be a list, got {_kind(value)}", where_of(value, where))
    return tuple(
        read_link(item, value.at(i), dest_key=dest_key, src_key=src_key, prob_key=prob_key)
        for i, item in enumerate(value)
    )


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
