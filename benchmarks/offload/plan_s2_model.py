"""The planner's model of the S2 8k step, per fold/cast/barrier path, from a measured record's rates (modeled).

Reads the rates of a committed S2 carina record (PCIe each way from the plan's probes; the CPU
update, fold and cast rates from the step timer's totals in the timed steps) and runs
``carina offload plan`` (the shape estimate, no GPU) for three paths: fold and cast on the CPU with
``step()`` waiting for every update (what that record ran), fold and cast on the device with the
barrier, and the same with updates carried past ``step()`` (opt-in until the CUDA tests of those paths
have run on a GPU). Writes one record with basis ``modeled``.

    python benchmarks/offload/plan_s2_model.py --record benchmarks/results/h200/offload_s2_7b16l_8k.json

With ``--tokens-per-step`` it instead plans every split of that many tokens into micro-batches
(``carina offload plan --tokens-per-step``, the library's default fold/cast/carry path) and records the
table beside the record's measured step, the split that record ran marked:

    python benchmarks/offload/plan_s2_model.py --record benchmarks/results/h200/s5/offload_s2_7b16l_32k.json \
        --tokens-per-step 32768
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from carina.core.bench import Basis, Figure, make_record, write_record

PATHS = {
    "fold and cast on the CPU, barrier (what the record ran)": ["--convert-on-host", "--step-barrier"],
    "fold and cast on the device, barrier": ["--convert-on-device", "--step-barrier"],
    "fold and cast on the device, updates past step()": ["--convert-on-device", "--no-step-barrier"],
}


def rates(record: dict) -> dict[str, float]:
    """GB/s and Gelem/s for the plan, from the record's plan probes and step timer."""
    run, split = record["metrics"]["carina"], record["metrics"]["step_split_s"]
    params = split["optim_params"]
    return {
        "h2d_gbps": run["hardware"]["h2d"] / 1e9,
        "d2h_gbps": run["hardware"]["d2h"] / 1e9,
        "optim_gparams": params / split["optim_update_s"] / 1e9,
        "fold_gelems": params / split["optim_fold_s"] / 1e9,
        "cast_gelems": params / split["optim_cast_s"] / 1e9,
        # with accumulation the timer's fold holds the host adds of the micro-batches after the first
        "grad_add_gelems": params * max(1, run["accum"] - 1) / split["optim_fold_s"] / 1e9,
    }


def split_mode(args: argparse.Namespace, record: dict, base: list[str]) -> None:
    """Plan every split of ``args.tokens_per_step`` and write one modeled record."""
    cmd = ["carina", "offload", "plan", *base, "--tokens-per-step", str(args.tokens_per_step), "--json"]
    out = subprocess.run([sys.executable, "-m", "carina", *cmd[1:]], check=True, capture_output=True, text=True)
    plan = json.loads(out.stdout)
    ran = record["metrics"]["carina"]["accum"]
    rows = [{**r, "measured_step_s": record["metrics"]["carina"]["step_s"] if r["micro_batches"] == ran else None}
            for r in plan["splits"]]  # fmt: skip
    figures = [Figure(name=f"predicted_step_s ({r['micro_batches']} x {r['tokens']} tokens)", value=r["step_s"],
                      unit="s", higher_is_better=False, basis=Basis.MODELED) for r in rows if r["fits"]]  # fmt: skip
    ideal = record["metrics"]["ideal_step_s"]
    metrics = {"splits": rows, "command": " ".join(cmd), "recommended_micro_batches": plan["micro_batches"],
               "measured_micro_batches": ran, "ideal_step_s_of_the_record": ideal,
               "predicted_fraction_of_ideal": ideal / plan["predicted_s"]["step"]}  # fmt: skip
    name = f"offload_plan_s5_7b{args.layers}l_{args.tokens_per_step // 1024}k_splits"
    rec = make_record(name=name, figures=figures, metrics=metrics,
                      config={"record": args.record, "layers": args.layers, "tokens_per_step": args.tokens_per_step},
                      notes="modeled by carina's planner (shape estimate), rates from the record; measured_step_s "
                      "is the record's own step at the split it ran")  # fmt: skip
    print(write_record(rec, directory=Path(args.out)))
    for row in rows:
        print(row)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--device-budget", default="20.5GB", help="the record's 24 GiB cap x 0.9 x (1 - 5% headroom)")
    ap.add_argument("--tflops", type=float, default=600.0)
    ap.add_argument("--out", default="benchmarks/results/cpu")
    ap.add_argument("--tokens-per-step", type=int, default=0, help="plan every split of this many tokens instead")
    args = ap.parse_args()
    record = json.loads(Path(args.record).read_text())
    r = rates(record)
    base = ["--model", "llama2-7b", "--layers", str(args.layers), "--tokens", str(args.tokens)]
    base += ["--device-budget", args.device_budget, "--tflops", str(args.tflops)]
    base += [f"--{k.replace('_', '-')}={v:.4g}" for k, v in r.items()]
    if args.tokens_per_step:
        split_mode(args, record, base)
        return
    rows, figures, commands = [], [], []
    for label, extra in PATHS.items():
        cmd = ["carina", "offload", "plan", *base, *extra, "--json"]
        commands.append(" ".join(cmd))
        out = subprocess.run([sys.executable, "-m", "carina", *cmd[1:]], check=True, capture_output=True, text=True)
        plan = json.loads(out.stdout)
        t = plan["predicted_s"]
        rows.append({
            "path": label,
            "step_s": round(t["step"], 3),
            "cpu_s": round(t["cpu_optimizer"], 3),
            "update_s": round(t["cpu_update"], 3),
            "fold_s": round(t["cpu_fold"], 3),
            "cast_s": round(t["cpu_cast"], 3),
            "h2d_s": round(t["h2d"], 3),
            "host_GB": round(plan["bytes"]["host"] / 1e9, 1),
            "bottleneck": plan["bottleneck"],
        })  # fmt: skip
        figures.append(Figure(name=f"predicted_step_s ({label})", value=t["step"], unit="s",
                              higher_is_better=False, basis=Basis.MODELED))  # fmt: skip
    metrics = {
        "paths": rows,
        "commands": commands,
        "measured_step_s_of_the_record": record["metrics"]["carina"]["step_s"],
        "roofline_step_s_of_the_record": record["metrics"]["roofline_step_s"],
    }
    rec = make_record(
        name=f"offload_plan_s2_7b{args.layers}l_{args.tokens // 1024}k",
        figures=figures,
        config={"record": args.record, "layers": args.layers, "tokens": args.tokens, "rates": r},
        metrics=metrics,
        notes="modeled by carina's planner (carina offload plan, shape estimate), rates from the record; "
        "the first path is the configuration the record measured",
    )
    print(write_record(rec, directory=Path(args.out)))
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
