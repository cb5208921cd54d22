"""Rich-based progress bars, tables and JSON output shared by every CLI command.

Progress and tables go to stderr/stdout through one console each; ``--json``
output goes to stdout alone, so it can be piped.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

__all__ = ["console", "emit_json", "print_table", "progress", "to_jsonable"]


def console(*, stderr: bool = False) -> Console:
    """The console carina prints to (stderr for progress and diagnostics)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


@contextlib.contextmanager
def progress(*, transient: bool = False) -> Iterator[Progress]:
    """A progress bar with carina's columns (bar, completed/total, rate, ETA) on stderr.

    Example:
        with progress() as bar:
            task = bar.add_task("writing", total=n)
            bar.advance(task)
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console(stderr=True),
        transient=transient,
        disable=not sys.stderr.isatty(),
    )
    with bar:
        yield bar


def print_table(
    rows: Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]],
    *,
    columns: Sequence[str],
    title: str | None = None,
) -> None:
    """Print rows (dicts keyed by column, or sequences in column order) as a table."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col)
    for row in rows:
        cells = [row.get(c, "") for c in columns] if isinstance(row, Mapping) else list(row)
        table.add_row(*("" if c is None else escape(str(c)) for c in cells))
    console().print(table)


def to_jsonable(obj: Any) -> Any:
    """Turn dataclasses, enums, paths and sets into plain JSON values."""
    import dataclasses
    import enum
    from pathlib import Path

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    return obj


def emit_json(obj: Any) -> None:
    """Write ``obj`` as indented JSON to stdout (and nothing else)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()
