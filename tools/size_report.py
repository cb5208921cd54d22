"""Lines per module of src/carina; flags modules over the ~400-line budget.

Usage: python tools/size_report.py [--check] [--all]

A module may carry ``# size-exception: <reason>`` to be listed but not flagged.
With --check the exit status is 1 when a module is flagged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BUDGET = 400
ROOT = Path(__file__).resolve().parents[1] / "src" / "carina"


def measure(root: Path = ROOT) -> list[tuple[int, str, bool]]:
    """``(lines, module path, excepted)`` for every module, largest first."""
    rows = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rows.append((text.count("\n"), str(path.relative_to(root.parent)), "# size-exception:" in text))
    return sorted(rows, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a module is over budget")
    parser.add_argument("--all", action="store_true", help="list every module, not only the largest 20")
    args = parser.parse_args()
    rows = measure()
    flagged = [r for r in rows if r[0] > BUDGET and not r[2]]
    total = sum(r[0] for r in rows)
    print(f"{len(rows)} modules, {total} lines, median {rows[len(rows) // 2][0] if rows else 0}")
    for lines, name, excepted in rows if args.all else rows[:20]:
        mark = " OVER BUDGET" if lines > BUDGET and not excepted else (" (size-exception)" if excepted else "")
        print(f"{lines:6d}  {name}{mark}")
    if flagged:
        print(f"{len(flagged)} module(s) over {BUDGET} lines", file=sys.stderr)
    return 1 if (args.check and flagged) else 0


if __name__ == "__main__":
    raise SystemExit(main())
