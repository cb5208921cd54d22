"""One record from a peers lane's log, for a harness run whose JSON files did not come back.

The harness prints, for every system it runs, ``[harness] <system> <tokens> tokens: ok <N> tokens/s,
steps [...]`` and the lane then prints the summary table (ideal and roofline columns) and one
``<record> ok loss within: <bool> max diff: <x> drift: <y>`` line per record. This script parses
those lines for one tag and writes a record whose figure is carina's tokens/s (as printed: whole
tokens/s) with the printed roofline as its ceiling and every other system that ran as a peer. The
record's ``command`` is the harness command the log names; its notes say it was transcribed and from
what, and its environment is taken from a record of the same device call (``--environment-from``).
Nothing the log does not print (peak memory, per-step losses) is filled in.

    python benchmarks/offload/peers/transcribe_lane_log.py LOG --tag s7b --environment-from REC.json --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from carina.core.bench import Figure, make_record, write_record

RUN = re.compile(r"^\[harness\] (\S+) (\d+) tokens: ok (\d+) tokens/s, steps (\[[^\]]*\])", re.M)
IDEAL = re.compile(r"^\[harness\] ideal (\d+) tokens: (\d+) tokens/s", re.M)
LOSS = r"^offload_peers_{config}_(\S+) ok loss within: (\w+) max diff: (\S+) drift: (\S+)"


def parse(text: str, tag: str) -> dict[str, Any]:
    """The runs, ideal, roofline, losses and command of the harness run tagged ``tag`` in ``text``."""
    commands = re.findall(r"^Command: `(.+?)`$", text, re.M)
    command = next((c for c in commands if f"--tag {tag} " in c + " "), None)
    if command is None:
        raise ValueError(f"no harness command with --tag {tag} in the log")
    table = re.search(rf"^\| {re.escape(tag)}_(\S+) \| (\d+) \| (\d+) \|", text, re.M)
    if table is None:
        raise ValueError(f"no summary row for {tag} in the log")
    runs = {name: {"tokens": int(tok), "tokens_per_s": float(tps), "steps_s": json.loads(steps)}
            for name, tok, tps, steps in RUN.findall(_section(text, tag))}  # fmt: skip
    config = f"{tag}_{table[1]}"
    losses = {
        system: {"within_tolerance": within == "True", "max_diff": float(diff), "drift": float(drift)}
        for system, within, diff, drift in re.findall(LOSS.format(config=re.escape(config)), text, re.M)
    }
    return {"command": command, "configuration": config, "ideal_tokens_per_s": float(table[2]),
            "roofline_tokens_per_s": float(table[3]), "runs": runs, "loss_checks": losses}  # fmt: skip


def _section(text: str, tag: str) -> str:
    """The part of the log after the preflight of the run tagged ``tag`` (its harness lines)."""
    marks = [m.start() for m in re.finditer(r"^\[harness\] calibrate:", text, re.M)]
    commands = [m for m in re.finditer(r"^Command: `(.+?)`$", text, re.M)]
    index = next(i for i, m in enumerate(commands) if f"--tag {tag} " in m[1] + " ")
    start = marks[index] if index < len(marks) else 0
    end = marks[index + 1] if index + 1 < len(marks) else len(text)
    return text[start:end]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--environment-from", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    got = parse(args.log.read_text(), args.tag)
    runs = dict(got["runs"])
    carina = runs.pop("carina")
    peers = {name: run["tokens_per_s"] for name, run in runs.items()}
    peers["ideal (unlimited memory)"] = got["ideal_tokens_per_s"]
    env_rec = json.loads(args.environment_from.read_text())
    fig = Figure(name="tokens_per_s", value=carina["tokens_per_s"], unit="tokens/s",
                 ceiling=got["roofline_tokens_per_s"],
                 ceiling_source="roofline: max(ideal compute, 4N/H2D, 2N/D2H, N/CPU-AdamW), measured in this run",
                 peers=peers)  # fmt: skip
    rec = make_record(
        name=f"offload_peers_{got['configuration']}_transcribed", figures=[fig], command=got["command"],
        config={"configuration": got["configuration"], "systems": ["carina", *runs]},
        metrics={**got, "log": f"h200/s7/offload_s7_phases.tar.gz: offload_s7_phases/{args.log.name}"},
        environment=env_rec["environment"],
        notes=("TRANSCRIBED from the lane's log: the harness run's JSON files were written on the device but not "
               "packed (benchmarks/h100_combined.sh packed the folder named by the lane argument, the lane wrote "
               "under its own LANE name; fixed). Values are as the log printed them (whole tokens/s)."),
    )  # fmt: skip
    rec["machine"] = env_rec["machine"]
    print(write_record(rec, directory=args.out))


if __name__ == "__main__":
    main()
