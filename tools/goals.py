"""The README's goals table: each issue goal, read from a committed record and judged against its target.

``docs/goals.toml`` lists the goals, one ``[[goal]]`` table each::

    [[goal]]
    subsystem = "offload"
    goal = "32k tokens/step, fraction of the ideal"
    record = "h200/s10/offload_s2_7b16l_head4096_32k.json"   # under benchmarks/results
    path = "metrics.fraction_of_ideal"                        # dotted; figures.NAME picks a figure by name
    op = ">="                                                 # >=, <=, >, <, between (target = [lo, hi])
    target = 0.85                                             # or target_path = "metrics..." (same record)
    unit = "fraction"                                         # optional, how the value is shown
    note = "why it misses, if it does"                        # optional, shown only when not met

A page marks the table with ``<!-- goals: docs/goals.toml -->`` ... ``<!-- /goals -->``;
``tools/render_docs.py`` fills it. The status column is computed, never typed: a goal is met only
when the record's number passes its target.
"""

from __future__ import annotations

import operator
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from carina.core.bench import load_records
from carina.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
OPS: dict[str, Callable[[float, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "between": lambda value, bounds: bounds[0] <= value <= bounds[1],
}
FIELDS = {"subsystem", "goal", "record", "path", "op", "target", "target_path", "unit", "note"}
REQUIRED = FIELDS - {"unit", "note", "target", "target_path"}
NAME_KEYS = ("name", "method")  # what names a list item: a figure's name, a summary row's method


class GoalError(ConfigError):
    """A goal entry or the record it points at is malformed; says which entry and why."""


def _named(item: Any, name: str) -> bool:
    return isinstance(item, Mapping) and any(item.get(key) == name for key in NAME_KEYS)


def _step(node: Any, keys: list[str], path: str) -> tuple[Any, int]:
    """The child of ``node`` that the longest run of ``keys`` names, and how many keys it took.

    Names may hold dots themselves (figure ``pcie_bw.h2d_gbps``, peer ``torch.save``), so the
    longest run of keys, joined by dots, that names exactly one list item or mapping key wins.
    """
    for n in range(len(keys), 0, -1):
        name = ".".join(keys[:n])
        if isinstance(node, list):
            matches = [item for item in node if _named(item, name)]
            if len(matches) == 1:
                return matches[0], n
        elif isinstance(node, Mapping) and name in node:
            return node[name], n
    if isinstance(node, list):
        count = sum(1 for item in node if _named(item, keys[0]))
        raise GoalError(f"{path}: {count} list items named {keys[0]!r}")
    raise GoalError(f"{path}: no key {keys[0]!r}")


def lookup(record: Mapping[str, Any], path: str) -> float:
    """The number at a dotted path of a record; ``figures.NAME.KEY`` selects a figure by its name.

    A name with dots in it is matched whole (``figures.pcie_bw.h2d_gbps.value``): see ``_step``.
    """
    node: Any = record
    keys = path.split(".")
    while keys:
        node, used = _step(node, keys, path)
        keys = keys[used:]
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise GoalError(f"{path}: not a number ({node!r})")
    return float(node)


def load_goals(file: Path) -> list[dict[str, Any]]:
    """The goal entries of a TOML file, each checked for its fields and operator."""
    entries = tomllib.loads(file.read_text()).get("goal", [])
    for n, entry in enumerate(entries, 1):
        unknown, missing = set(entry) - FIELDS, REQUIRED - set(entry)
        if unknown or missing:
            raise GoalError(f"{file.name} goal {n}: unknown {sorted(unknown)}, missing {sorted(missing)}")
        if ("target" in entry) == ("target_path" in entry):
            raise GoalError(f"{file.name} goal {n}: give exactly one of target and target_path")
        if entry["op"] not in OPS:
            raise GoalError(f"{file.name} goal {n}: op {entry['op']!r} is not one of {sorted(OPS)}")
        two = isinstance(entry.get("target"), list)
        if (entry["op"] == "between") != two or (two and len(entry["target"]) != 2):
            raise GoalError(f"{file.name} goal {n}: 'between' takes target = [lo, hi], the others one number")
    return list(entries)


def judge(entry: Mapping[str, Any], results: Path = RESULTS) -> tuple[float, Any, bool]:
    """The record's value for a goal, its target (given, or read from the same record), and whether it passes."""
    file = results / entry["record"]
    if not file.exists():
        raise GoalError(f"goal {entry['goal']!r}: no record {entry['record']}")
    [record] = load_records(file)  # validated as every record the docs render
    value = lookup(record, entry["path"])
    if "target_path" in entry:
        target: Any = lookup(record, entry["target_path"])
    elif isinstance(entry["target"], list):
        target = [float(bound) for bound in entry["target"]]
    else:
        target = float(entry["target"])
    return value, target, OPS[entry["op"]](value, target)


def _show(value: float, unit: str) -> str:
    if unit == "fraction":
        return f"{value:.1%}"
    text = f"{value:.4g}"
    return f"{text} {unit}".strip()


def render_goals(file: Path, results: Path = RESULTS) -> str:
    """The markdown table of every goal in ``file``, with its measured value and computed status."""
    lines = [
        "| subsystem | goal | measured | target | status | record |",
        "|---|---|---|---|---|---|",
    ]
    for entry in load_goals(file):
        value, target_value, met = judge(entry, results)
        unit = entry.get("unit", "")
        status = "met" if met else "**not met**" + (f": {entry['note']}" if entry.get("note") else "")
        if isinstance(target_value, list):
            target = f"{_show(target_value[0], unit)} to {_show(target_value[1], unit)}"
        else:
            target = f"{entry['op']} {_show(target_value, unit)}"
        lines.append(
            f"| {entry['subsystem']} | {entry['goal']} | {_show(value, unit)} | {target} | {status} | "
            f"`{entry['record']}` |"
        )
    return "\n".join(lines) + f"\n\n_Generated from `{file.resolve().relative_to(REPO)}` and the records it names._\n"
