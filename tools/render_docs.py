"""Fill the results tables in docs/*.md and README.md from committed benchmark records.

A page marks a table with ``<!-- results: GLOB -->`` ... ``<!-- /results -->``,
GLOB relative to benchmarks/results (e.g. ``*/io_*.json``). Run with --check
to exit 1 when a page is stale (the test suite does).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- results: (?P<glob>[^>]+?) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


def render_page(text: str) -> str:
    """The page with every results block regenerated."""
    from carina.core.bench import load_records, render_markdown

    def fill(match: re.Match[str]) -> str:
        files = sorted(RESULTS.glob(match["glob"].strip()))
        body = render_markdown(load_records(files)) if files else "_No committed records yet._\n"
        return f"{match.group(1)}{body}{match.group(4)}"

    return BLOCK.sub(fill, text)


def pages() -> list[Path]:
    """Every page that may hold results blocks."""
    return [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]


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
