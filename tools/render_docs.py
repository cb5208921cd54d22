"""Fill the results tables in docs/**/*.md and README.md from committed benchmark records.

A page marks a table with ``<!-- results: GLOB -->`` ... ``<!-- /results -->``,
GLOB relative to benchmarks/results (e.g. ``*/io_*.json``): one row per figure.
``<!-- rows: FILE metrics.KEY col1,col2 -->`` ... ``<!-- /rows -->`` renders a list of
dicts stored in one record's metrics (e.g. a node's check report).
``<!-- goals: docs/goals.toml -->`` ... ``<!-- /goals -->`` renders the issues' goals, each judged
from the record it names (``tools/goals.py``). Run with --check
to exit 1 when a page is stale (the test suite does).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import render_goals  # a sibling script, not a package

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- results: (?P<glob>[^>]+?) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)
GOALS = re.compile(r"(<!-- goals: (?P<file>\S+) -->\n)(?P<body>.*?)(<!-- /goals -->)", re.S)
ROWS = re.compile(
    r"(<!-- rows: (?P<file>\S+) metrics\.(?P<key>\S+) (?P<cols>\S+) -->\n)(?P<body>.*?)(<!-- /rows -->)", re.S
)


def _cell(value: object) -> str:
    text = f"{value:.3g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def render_rows(file: str, key: str, cols: list[str]) -> str:
    """A markdown table of the dicts at ``metrics[key]`` of one record."""
    from carina.core.bench import load_records

    path = RESULTS / file
    if not path.exists():
        return "_No committed record yet._\n"
    [record] = load_records(path)
    rows = record["metrics"].get(key, [])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in cols) + " |" for row in rows]
    return "\n".join(lines) + f"\n\n_From `{file}`, made by `{record['command']}`._\n"


def render_page(text: str) -> str:
    """The page with every results block regenerated."""
    from carina.core.bench import load_records, render_markdown

    def fill(match: re.Match[str]) -> str:
        files = sorted(RESULTS.glob(match["glob"].strip()))
        body = render_markdown(load_records(files)) if files else "_No committed records yet._\n"
        return f"{match.group(1)}{body}{match.group(4)}"

    text = BLOCK.sub(fill, text)
    text = GOALS.sub(lambda m: f"{m.group(1)}{render_goals(REPO / m['file'])}{m.group(4)}", text)
    return ROWS.sub(lambda m: f"{m.group(1)}{render_rows(m['file'], m['key'], m['cols'].split(','))}{m.group(6)}", text)


def pages() -> list[Path]:
    """Every page that may hold results blocks."""
    return [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale pages instead of writing")
    args = parser.parse_args()
    stale = []
    for page in pages():
        if not page.exists():
            continue
        old = page.read_text()
        new = render_page(old)
        if new != old:
            stale.append(page.relative_to(REPO))
            if not args.check:
                page.write_text(new)
    for page in stale:
        print(f"{'stale' if args.check else 'updated'}: {page}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
