"""YAML reading that remembers where every mapping, key and list item came from.

Risk models are outside input, so every error must point at ``file:line``. PyYAML's
safe loader is extended to build :class:`LocatedDict` and :class:`LocatedList`
containers that carry the line of each key and item; duplicate keys are errors
(plain PyYAML silently keeps the last one). :func:`read_documents` follows
``includes`` recursively, relative to the including file, and rejects cycles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from carina.core.errors import ModelFormatError

__all__ = ["Located", "LocatedDict", "LocatedList", "SourceFile", "load_yaml", "read_documents"]


@dataclass(frozen=True)
class Located:
    """A position in an input file (1-based line)."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class LocatedDict(dict[Any, Any]):
    """A YAML mapping with the line of the mapping and of each key."""

    where: Located
    key_where: dict[Any, Located]

    def at(self, key: Any) -> Located:
        """Where ``key`` is written (the mapping's start if it is absent)."""
        return self.key_where.get(key, self.where)


class LocatedList(list[Any]):
    """A YAML sequence with the line of the sequence and of each item."""

    where: Located
    item_where: list[Located]

    def at(self, index: int) -> Located:
        """Where item ``index`` is written."""
        return self.item_where[index] if index < len(self.item_where) else self.where


def where_of(value: Any, fallback: Located) -> Located:
    """The location of a parsed value, or ``fallback`` for plain scalars."""
    return value.where if isinstance(value, LocatedDict | LocatedList) else fallback


def _make_loader(file: str) -> type[yaml.SafeLoader]:
    class _Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LocatedDict:
        out = LocatedDict()
        out.where = Located(file, node.start_mark.line + 1)
        out.key_where = {}
        loader.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            here = Located(file, key_node.start_mark.line + 1)
            try:
                hash(key)
            except TypeError:
                raise ModelFormatError("mapping key is not a plain value", file=file, line=here.line) from None
            if key in out:
                first = out.key_where[key]
                raise ModelFormatError(f"duplicate key {key!r} (first at line {first.line})", file=file, line=here.line)
            out[key] = loader.construct_object(value_node, deep=True)
            out.key_where[key] = here
        return out

    def sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> LocatedList:
        out = LocatedList(loader.construct_object(child, deep=True) for child in node.value)
        out.where = Located(file, node.start_mark.line + 1)
        out.item_where = [Located(file, child.start_mark.line + 1) for child in node.value]
        return out

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, sequence)
    return _Loader


def load_yaml(text: str, file: str = "<string>") -> Any:
    """Parse one YAML document with locations; syntax errors become :class:`ModelFormatError`."""
    try:
        return yaml.load(text, Loader=_make_loader(file))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ModelFormatError(f"YAML syntax error: {exc.problem or exc}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ModelFormatError(f"YAML error: {exc}", file=file) from None
    except RecursionError:
        raise ModelFormatError("YAML nesting too deep", file=file) from None


@dataclass(frozen=True)
class SourceFile:
    """One parsed file of a model and the file that included it."""

    path: Path
    data: LocatedDict
    included_from: Located | None


def read_documents(path: str | Path, *, include_key: str = "includes") -> list[SourceFile]:
    """Read ``path`` and, depth first, every file its ``includes`` name.

    Returns the files in include order with the main file last, so later files see
    what earlier ones define. Each file is read once; a cycle is an error.
    """
    out: list[SourceFile] = []
    _read(Path(path), include_key, out, stack=[], seen=set(), included_from=None)
    return out


def _read(
    path: Path,
    include_key: str,
    out: list[SourceFile],
    *,
    stack: list[Path],
    seen: set[Path],
    included_from: Located | None,
) -> None:
    real = path.resolve()
    if real in stack:
        chain = " -> ".join(p.name for p in [*stack, real])
        line = included_from.line if included_from else None
        file = included_from.file if included_from else str(path)
        raise ModelFormatError(f"include cycle: {chain}", file=file, line=line)
    if real in seen:
        return
    try:
        text = path.read_text()
    except OSError as exc:
        file = included_from.file if included_from else str(path)
        line = included_from.line if included_from else None
        raise ModelFormatError(f"cannot read model file {str(path)!r}: {exc.strerror}", file=file, line=line) from None
    data = load_yaml(text, str(path))
    if data is None:
        data = LocatedDict()
        data.where, data.key_where = Located(str(path), 1), {}
    if not isinstance(data, LocatedDict):
        raise ModelFormatError("a model file must be a YAML mapping at top level", file=str(path), line=1)
    seen.add(real)
    includes = data.get(include_key, [])
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ModelFormatError(
            f"'{include_key}' must be a list of file names", file=str(path), line=data.at(include_key).line
        )
    for index, name in enumerate(includes):
        loc = includes.at(index) if isinstance(includes, LocatedList) else data.at(include_key)
        _read(path.parent / name, include_key, out, stack=[*stack, real], seen=seen, included_from=loc)
    out.append(SourceFile(path=path, data=data, included_from=included_from))
