"""Split the records list that ``h100_s2.sh`` writes into one file per record.

Usage: python benchmarks/io/split_records.py OUT/io/io_s2_records.json [benchmarks/results/h100]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    src = Path(sys.argv[1])
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("benchmarks/results/h100")
    dest.mkdir(parents=True, exist_ok=True)
    for record in json.loads(src.read_text()):
        path = dest / f"{record['name']}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(path)


if __name__ == "__main__":
    main()
