"""Complete an overhead record whose run was cut by its step limit, from the windows its log printed.

``bench_overhead.py`` writes its record after each method; a limit that kills it during the
last clean window leaves the record with the setup alone, while the log holds every timed
window (``  carina-process K=25: [{...}, ...]``) and the clean window before each. This script
parses those lines, puts them into the device's own record (its machine, environment and
command stay), recomputes the summary with ``bench_overhead.rows`` and says so in the notes.
Nothing that was not printed (peak host memory, the final clean window) is filled in.

    python benchmarks/ckpt/transcribe_overhead_log.py RECORD.json OVER.log OUT.json
"""

from __future__ import annotations

import ast
import json
import re
import sys
from argparse import Namespace
from pathlib import Path

from bench_overhead import rows


def parse(text: str) -> dict[str, dict[str, object]]:
    """{method: {"windows": {K: {..., "reps": [...]}}}} from the printed window lines."""
    methods: dict[str, dict[str, object]] = {}
    for name, k, reps in re.findall(r"^  (\S+) K=(\d+): (\[.*\])$", text, re.M):
        windows = ast.literal_eval(reps)
        entry = {**windows[0], "reps": windows} if len(windows) > 1 else windows[0]
        methods.setdefault(name, {"windows": {}, "host_extra_GB": None})["windows"][k] = entry  # type: ignore[index]
    return methods


def main() -> None:
    record_path, log_path, out_path = (Path(a) for a in sys.argv[1:4])
    rec = json.loads(record_path.read_text())
    metrics = rec["metrics"]
    metrics["methods"] = parse(log_path.read_text())
    cfg = rec["config"]
    args = Namespace(steps=cfg["steps"], clean_between=cfg["clean_between"])
    metrics["summary"] = rows(args, metrics)
    rec["figures"] = [
        {"name": f"overhead_{r['method'].removeprefix('carina-')}_k{r['interval']}", "value": r["overhead_pct"],
         "unit": "%", "higher_is_better": False, "basis": "measured",
         "ceiling": None, "ceiling_source": "none (0 %)", "ratio_to_ceiling": None, "peers": {}}
        for r in metrics["summary"] if "overhead_pct" in r
    ]  # fmt: skip
    rec["notes"] += (" The step limit killed the run in the clean window after the last interval, before the "
                     "record was rewritten: the timed windows and the clean windows before them are transcribed "
                     f"from its log ({log_path.name}) by benchmarks/ckpt/transcribe_overhead_log.py; the last "
                     "window's T_clean is the window before it alone; peak host memory was not printed.")  # fmt: skip
    out_path.write_text(json.dumps(rec, indent=2) + "\n")
    print(json.dumps(metrics["summary"], indent=1))


if __name__ == "__main__":
    main()
