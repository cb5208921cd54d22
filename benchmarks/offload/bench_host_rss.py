"""Peak host RSS of a whole CPU run against the plan's host bytes, and the process's baseline beside them.

Runs ``tests/offload/host_rss_probe.py`` in fresh processes: a 60M-parameter Llama (six blocks of 12.8M)
whose AdamW state spills to NVMe under a host budget of 14 B per parameter, the blocks streamed under a
300 MB device budget, two profiling and two planned steps. With device="cpu" the device tier is RAM too,
so the plan's bound is its host bytes plus its device peak. Two runs: glibc's default allocator (it keeps
freed chunks under its dynamic mmap threshold) and ``MALLOC_MMAP_THRESHOLD_=65536`` (freed memory goes
back at once: what is measured is what is live). Writes ``benchmarks/results/cpu/offload_host_rss.json``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/offload/bench_host_rss.py --nvme /var/tmp/carina-rss
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from carina.core.bench import Figure, make_record, write_record

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "offload" / "host_rss_probe.py"


def probe(nvme: str, env_extra: dict[str, str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env_extra}
    args = [sys.executable, str(PROBE), "--nvme", nvme, "--device-budget", "300000000"]
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    run = json.loads(out.stdout.strip().splitlines()[-1])
    baseline = run["rss_before_wrap"] - run["model_bytes"]
    plan = run["planned_host_bytes"] + max(run["planned_device_peak"], run["ledger_device_peak"])
    run["peak_growth_bytes"] = run["rss_peak"] - baseline
    run["peak_growth_over_plan"] = run["peak_growth_bytes"] / plan
    run["peak_growth_minus_plan_bytes"] = run["peak_growth_bytes"] - plan
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvme", required=True, help="a directory for the NVMe tier")
    args = ap.parse_args()
    runs = {
        "glibc_default": probe(args.nvme, {}),
        "mmap_threshold_64k": probe(args.nvme, {"MALLOC_MMAP_THRESHOLD_": "65536"}),
    }
    for k, r in runs.items():
        print(
            f"{k:20} peak RSS growth {r['peak_growth_bytes'] / 1e6:8.1f} MB = {r['peak_growth_over_plan']:.3f}x plan "
            f"(host {r['planned_host_bytes'] / 1e6:.1f} MB + device); baseline {r['process_baseline'] / 1e6:.1f} MB"
        )
    live, default = runs["mmap_threshold_64k"], runs["glibc_default"]
    figs = [
        Figure(
            name="peak_rss_growth_over_plan",
            value=live["peak_growth_over_plan"],
            unit="x",
            higher_is_better=False,
            peers={"glibc's default mmap threshold": default["peak_growth_over_plan"]},
        ),
        Figure(name="process_baseline_bytes", value=live["process_baseline"], unit="B", higher_is_better=False),
    ]
    config = {
        "model": "Llama hidden 1024, 6 layers, vocab 4096",
        "params": live["model_bytes"] // 4,
        "host_budget": live["host_budget"],
        "device": "cpu",
        "device_budget": 300000000,
        "tokens_per_step": 32,
        "profile_steps": 2,
        "planned_steps": 2,
    }
    rec = make_record(
        name="offload_host_rss",
        figures=figs,
        config=config,
        command="PYTHONPATH=$PWD/src .venv/bin/python benchmarks/offload/bench_host_rss.py --nvme /var/tmp/carina-rss",
        metrics=runs,
        notes="Peak RSS (VmHWM from wrap() through the planned steps) less the process's baseline (RSS before "
        "wrap less the model's float32 bytes), over the plan's host bytes plus its device peak (the larger of "
        "the plan's and the device ledger's; the device is the CPU). process_baseline: what host_budget does "
        "not cover (handle_of(model).process_baseline, measured at wrap: interpreter, torch, transformers).",
    )
    print("wrote", write_record(rec))


if __name__ == "__main__":
    main()
