"""Benchmark: the TEE suite natively and through the emulated CC link, and their comparison.

Writes three records under benchmarks/results/<machine>/ (or --out): ``security_tee_native_<dev>``,
``security_tee_emulated_<dev>`` (every transfer AES-GCM-sealed into a bounce buffer on the
CPU, measured; GPU-side crypto and the per-crossing toll modeled) and
``security_tee_compare_<dev>`` (overheads emulated vs native, basis emulated), plus the
overhead plot as PNG. Detection runs for real; on a machine without CC mode the records
say so and attestation is reported unavailable.

CPU run: ``.venv/bin/python benchmarks/security/bench_tee.py --device cpu --preset cpu``
GPU run: ``python3 benchmarks/security/bench_tee.py --device cuda --preset gpu``
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

PRESETS = {
    "smoke": {
        "models": ["bert-tiny", "llama-tiny", "granite-tiny"],
        "batches": [1, 2],
        "seq_lens": [8],
        "new_tokens": 3,
        "sizes": [4 << 10, 64 << 10],
        "dtype": "float32",
        "repeat": 1,
    },
    "cpu": {
        "models": ["bert-base", "llama-small", "granite-tiny"],
        "batches": [1, 4, 16],
        "seq_lens": [64],
        "new_tokens": 8,
        "sizes": [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
        "dtype": "float32",
        "repeat": 3,
    },
    "gpu": {
        "models": ["bert-base", "bert-large", "llama-1b", "granite-1b"],
        "batches": [1, 8, 32],
        "seq_lens": [128],
        "new_tokens": 16,
        "sizes": [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20],
        "dtype": "bfloat16",
        "repeat": 3,
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 keeps a busy 2-core box honest)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--compare-only", nargs=2, type=Path, metavar=("NATIVE", "EMULATED"), help="only (re)build the comparison"
    )
    args = ap.parse_args()
    if args.compare_only:
        from carina.security.tee.report import load_record

        native, emulated = (load_record(p) for p in args.compare_only)
        _write_compare(native, emulated, args, " ".join(["python", *sys.argv]))
        return

    import torch

    from carina.core.bench import write_record
    from carina.security.tee.emulate import CCLinkConfig
    from carina.security.tee.micro import MicroConfig, pick_device
    from carina.security.tee.report import bench_record
    from carina.security.tee.workloads import WorkloadConfig, run_paired

    if args.threads:
        torch.set_num_threads(args.threads)
    p = PRESETS[args.preset]
    dev = pick_device(args.device)
    tag = dev.split(":")[0]
    link = CCLinkConfig(capacity=max([*p["sizes"], 1 << 20]))
    command = " ".join(["python", *sys.argv])
    records = {}
    work = WorkloadConfig(
        device=dev, models=p["models"], batches=p["batches"], seq_lens=p["seq_lens"],
        new_tokens=p["new_tokens"], dtype=p["dtype"], repeat=p["repeat"], link=link,
    )  # fmt: skip
    paired = run_paired(work)  # both modes back to back per model and batch, each warmed first
    for mode in ("native", "emulated"):
        micro = MicroConfig(device=dev, mode=mode, sizes=p["sizes"], repeat=p["repeat"], link=link)
        work_mode = dataclasses.replace(work, mode=mode)
        rec = bench_record(micro, work_mode, name=f"security_tee_{mode}_{tag}", command=command, work_rows=paired[mode])
        records[mode] = rec
        path = write_record(records[mode], directory=args.out)
        print("wrote", path, flush=True)
    _write_compare(records["native"], records["emulated"], args, command)


def _write_compare(native: dict, emulated: dict, args: argparse.Namespace, command: str) -> None:
    from carina.core.bench import Basis, Figure, make_record, results_dir, write_record
    from carina.security.tee.report import compare, render_compare_png

    result = compare(native, emulated)
    tag = native["name"].rsplit("_", 1)[-1]
    figures = [
        Figure(
            name=f"{r['model']}_b{r['batch']}_s{r['seq']}{'_pipe' if r['pipelined'] else ''}_latency_overhead",
            value=r["latency_overhead"],
            unit="fraction",
            higher_is_better=False,
            basis=Basis.EMULATED,
        )
        for r in result["workloads"]
    ]
    rec = make_record(
        name=f"security_tee_compare_{tag}",
        figures=figures,
        config={"native": native["name"], "emulated": emulated["name"], "link": emulated["metrics"].get("assumptions")},
        metrics=result,
        command=command,
        environment=native["environment"],
        notes="Emulated CC overhead: CPU AES-GCM and copies measured, GPU-side crypto and crossing toll modeled. "
        "latency_overhead shares one compute time between both sides (see carina.security.tee.report.compare).",
    )
    path = write_record(rec, directory=args.out)
    render_compare_png(result, (args.out or results_dir(rec["machine"]["label"])) / f"security_tee_compare_{tag}.png")
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
