"""Make ``ckpt_restore_h100.json`` from the log of the second combined device call (session 2, call 4).

The restore step printed carina's cold/warm medians before the combined call's 120 s lane limit killed
the script; its JSON was written only at the end (to the device's /tmp) and was lost. This script parses
the printed lines of that log and records exactly those figures, labelled as transcribed. Nothing else
(peers, read+verify time, ceilings) is recorded: those were never printed.

    python benchmarks/ckpt/transcribe_restore_h100.py /work/gpu/call4/ckpt/h100_s2.log
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from carina.core.bench import Figure, make_record, write_record

DEVICE_COMMAND = (
    "OUT=$OUT bash benchmarks/h100_combined.sh ckpt=benchmarks/ckpt/h100_s2.sh:120 "
    "faults=benchmarks/security_faults/h100_s2.sh:95 gnn=benchmarks/gnn/h100_s2.sh:110 "
    "disagg=benchmarks/offload/disagg_h100_s2.sh:90 io=benchmarks/io/h100_s2.sh:80 "
    "storage=benchmarks/infra_storage/h100_s2.sh:45"
)
MAIN_SHA = "949a4ce86acd582e2ef3628bd94e906a15a04f5c"
LOG_NAME = "h100_s2.log (the ckpt lane's log of the combined device call of session 2, call 4)"


def parse(text: str) -> dict[str, object]:
    """The printed figures of the restore step and the GPU-test summary."""
    restore = text.split("== restore", 1)[1]
    state = re.search(r"state ([0-9.]+) GB, disk read ([0-9.]+) GB/s \((.*)\)", restore)
    carina = re.search(r"^carina (\{.*\})$", restore, re.M)
    tests = re.search(r"^(\d+) passed in ([0-9.]+)s$", text, re.M)
    if not (state and carina and tests):
        raise SystemExit("log lacks the restore lines or the GPU-test summary")
    return {
        "state_GB": float(state.group(1)),
        "disk_read_GBps": float(state.group(2)),
        "disk_ceiling_source": state.group(3),
        "carina": json.loads(carina.group(1)),
        "gpu_tests_passed": int(tests.group(1)),
        "gpu_tests_s": float(tests.group(2)),
    }


def main() -> None:
    got = parse(Path(sys.argv[1]).read_text())
    c = got["carina"]
    assert isinstance(c, dict) and c["bitwise"] is True
    figures = [
        Figure(name="restore_cold", value=c["cold_s_median"], unit="s", higher_is_better=False),
        Figure(name="restore_warm", value=c["warm_s_median"], unit="s", higher_is_better=False),
    ]
    metrics = {
        "summary": [{"method": "carina", "cold_s_median": round(c["cold_s_median"], 4),
                     "warm_s_median": round(c["warm_s_median"], 4), "bitwise": True}],
        "state_GB": got["state_GB"],  # as printed (3 decimals)
        "disk_read_GBps": got["disk_read_GBps"],  # as printed (2 decimals)
        "disk_ceiling_source": got["disk_ceiling_source"],
        "gpu_tests": f"{got['gpu_tests_passed']} passed in {got['gpu_tests_s']} s "
                     "(tests/ckpt/test_ckpt_gpu.py: side-stream staging with the fork, process and thread writers, "
                     "managed memory with the fork and thread writers)",
        "not_measured": "torch.load and dcp.load restores, carina's read+verify time: the lane limit killed the "
                        "script before they printed; the stall step (ckpt_stall) was killed at its own limit",
    }  # fmt: skip
    notes = (
        "transcribed from h100_s2.log of the device call; the script's JSON was lost when the step limit "
        "killed it (the script wrote its record only when the step ended, and the combined call's 120 s lane "
        "limit killed it 29 s into the restore step). Log: " + LOG_NAME + ". "
        "1e8-parameter MLP stack (fp32 params + AdamW moments) restored "
        "into the live model and optimizer on the GPU, 2 reps; cold = files evicted with "
        "posix_fadvise(DONTNEED) before each restore; carina reads every shard through carina.io, checks every "
        "crc32, then loads; bitwise = the restored state equals the saved one. Only the printed figures are "
        "recorded; no peer was reached."
    )
    config = {"params": 1e8, "device": "cuda", "reps": 2, "threads": 1,
              "step": "bench_restore.py --params 1e8 --device cuda --reps 2 --name ckpt_restore_h100"}  # fmt: skip
    env = {"machine": "H100 80GB HBM3 device machine, torch 2.11.0+cu130", "note": "not captured"}
    rec = make_record(name="ckpt_restore_h100", figures=figures, config=config, command=DEVICE_COMMAND,
                      metrics=metrics, notes=notes, environment=env)  # fmt: skip
    rec["git_sha"], rec["git_dirty"] = MAIN_SHA, False
    rec["machine"] = {"label": "h100", "hostname": "not captured"}
    print(write_record(rec))


if __name__ == "__main__":
    main()
