"""The planner's step with and without the host memory term, from measured records' rates (modeled).

For each committed S2 carina record (``benchmarks/results/h200/s7/offload_s2_7b16l_{8k,32k}.json``) this
runs ``carina offload plan`` (the shape estimate, no GPU) with the rates the record's own run probed
(``metrics.carina.hardware``: PCIe each way, the CPU AdamW alone, the fold and the cast), the record's
tokens, micro-batches and planned device budget (``device_budget x (1 - allocator_headroom)``), and the
compute rate that makes the estimate's compute equal the record plan's profiled compute. Two rows each:

* host memory not modeled (``--host-mem-gbps -1``): the planner as the record's run had it;
* host memory modeled (``--host-mem-gbps 0``): the bandwidth is the least the probed AdamW rate implies
  (28 bytes read and written per parameter; the record's run had no host-memory probe), the rule
  :func:`carina.offload.profiler.host_memory_rate` applies when no larger pass rate is measured;
* the same with every block's activations recomputed (``--activations recompute``), the choice without
  swaps to set the planner's choice against.

Where the record's run probed the host memory (``metrics.carina.hardware.host_mem``, session 8 on), two more
rows at that bandwidth: gradients leaving the device as float32 (``--float32-grads``) and in the compute dtype
(``--narrow-grads``, the library's default with one micro-batch and no clipping)::

    python benchmarks/offload/plan_hostmem_model.py --name offload_plan_s8_narrowgrads_7b16l_8k \
        --record benchmarks/results/h200/s8/offload_s2_7b16l_8k.json

With ``--head-chunk-tokens N`` (repeatable) one more row each: host memory modeled and the head and loss
chunked into N tokens (:func:`carina.offload.chunked_lm_loss`, ``carina offload plan --head-chunk-tokens``):
what the plan becomes when the logits no longer take the device budget. Each row's ``ideal_over_step`` is
the record's ideal step (``metrics.ideal_step_s``) over the row's predicted step.

Beside them, the record's own step, and the host traffic its measured moves imply (AdamW's bytes over the
updated parameters plus the bytes moved each way per step) at that bandwidth. One record, basis modeled::

    python benchmarks/offload/plan_hostmem_model.py \
        --record benchmarks/results/h200/s7/offload_s2_7b16l_8k.json \
        --record benchmarks/results/h200/s7/offload_s2_7b16l_32k.json

The chunked-head record (32k only)::

    python benchmarks/offload/plan_hostmem_model.py --name offload_plan_s7_headchunk_7b16l_32k \
        --record benchmarks/results/h200/s7/offload_s2_7b16l_32k.json \
        --head-chunk-tokens 8192 --head-chunk-tokens 4096 --head-chunk-tokens 2048
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from carina.core.bench import Basis, Figure, make_record, write_record

ADAMW_BYTES = 28  # master, gradient, m, v read; master, m, v written (float32)
#: Where the record's run probed the host memory's bandwidth: a row at it for each way gradients leave the device.
GRADS = (("float32", "--float32-grads"), ("compute-dtype", "--narrow-grads"))


def plan(base: list[str], *extra: str) -> dict:
    """``carina offload plan ... --json`` in a subprocess, parsed."""
    cmd = [sys.executable, "-m", "carina", "offload", "plan", *base, *extra, "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def base_args(record: dict, layers: int) -> list[str]:
    """The plan's arguments from a record: shape, tokens, budget and the run's probed rates."""
    run = record["metrics"]["carina"]
    hw, cfg = run["hardware"], run["config"]
    budget = int(cfg["device_budget"] * (1 - cfg["allocator_headroom"]))
    tokens = run["tokens"] // max(1, run["accum"])
    args = ["--model", "llama2-7b", "--layers", str(layers), "--tokens", str(tokens),
            "--micro-batches", str(run["accum"]), "--device-budget", str(budget), "--resident", "off",
            f"--h2d-gbps={hw['h2d'] / 1e9:.4g}", f"--d2h-gbps={hw['d2h'] / 1e9:.4g}",
            f"--optim-gparams={hw['optim'] / 1e9:.4g}", f"--fold-gelems={hw['fold'] / 1e9:.4g}",
            f"--cast-gelems={hw['cast'] / 1e9:.4g}", f"--grad-add-gelems={hw['grad_add'] / 1e9:.4g}"]  # fmt: skip
    probe = plan([*args, "--tflops", "1000", "--host-mem-gbps", "-1"])["predicted_s"]["compute"]
    tflops = 1000 * probe / run["plan"]["predicted_s"]["compute"]  # the estimate's compute = the profiled one
    return [*args, "--tflops", f"{tflops:.4g}"]


def row(label: str, out: dict) -> dict:
    """One table row of a plan."""
    t, blocks = out["predicted_s"], out["blocks"]
    return {
        "model": label,
        "step_s": round(t["step"], 4),
        "bottleneck": out["bottleneck"],
        "cpu_update_s": round(t["cpu_update"], 4),
        "host_memory_s": round(t["host_memory"], 4),
        "host_traffic_GB": round(out["host_memory"]["traffic_bytes_per_step"] / 1e9, 2),
        "host_bandwidth_GBps": round(out["host_memory"]["bandwidth_bytes_per_s"] / 1e9, 1),
        "h2d_s": round(t["h2d"], 4),
        "d2h_s": round(t["d2h"], 4),
        "compute_s": round(t["compute"], 4),
        "blocks": {k: blocks[k] for k in ("keep", "swap", "recompute", "resident", "streamed", "cast_on_device")},
        "activation_lead": out["activation_lead"],
    }


def model_record(path: str, layers: int, chunks: list[int]) -> tuple[dict, list[Figure], list[str]]:
    """The rows, figures and commands of one record."""
    record = json.loads(Path(path).read_text())
    run = record["metrics"]["carina"]
    base = base_args(record, layers)
    tag = f"{run['tokens'] // 1024}k"
    rows, figures, commands = [], [], []
    probed = run["hardware"].get("host_mem", 0.0)  # the run's own host-memory probe (session 8 on)
    at_probe = [f"--host-mem-gbps={probed / 1e9:.4g}"] if probed else []
    variants = (
        ("host memory not modeled", ["--host-mem-gbps", "-1"]),
        *((f"host memory probed, {g} gradients", [*at_probe, flag]) for g, flag in GRADS if at_probe),
        ("host memory modeled", ["--host-mem-gbps", "0"]),
        ("host memory modeled, every block recomputed", ["--host-mem-gbps", "0", "--activations", "recompute"]),
        *((f"host memory modeled, head chunked {c}", ["--host-mem-gbps", "0", "--head-chunk-tokens", str(c)])
          for c in chunks),
    )  # fmt: skip
    for label, flags in variants:
        out = plan(base, *flags)
        rows.append(row(label, out))
        commands.append(" ".join(["carina", "offload", "plan", *base, *flags, "--json"]))
        figures.append(Figure(name=f"predicted_step_s {tag} ({label})", value=out["predicted_s"]["step"], unit="s",
                              higher_is_better=False, basis=Basis.MODELED, ceiling=record["metrics"]["ideal_step_s"],
                              ceiling_source="the record's ideal step (metrics.ideal_step_s, its definition there)",
                              peers={"the record's measured step": run["step_s"]}))  # fmt: skip
    for r in rows:
        r["ideal_over_step"] = round(record["metrics"]["ideal_step_s"] / r["step_s"], 3)
    moved = run["moved_per_step"]
    implied = ADAMW_BYTES * run["step_split"]["optim_params"] + moved["host->device"] + moved["device->host"]
    bandwidth = probed or rows[1]["host_bandwidth_GBps"] * 1e9
    measured = {
        "step_s": run["step_s"],
        "record_plan_step_s": run["plan"]["predicted_s"]["step"],
        "ideal_step_s": record["metrics"]["ideal_step_s"],
        "ideal_over_step": record["metrics"]["ideal_step_s"] / run["step_s"],
        "record_plan_blocks": run["plan"]["blocks"],
        "optim_update_s": run["step_split"]["optim_update_s"],
        "moved_per_step": moved,
        "host_traffic_from_moves_GB": implied / 1e9,
        "host_traffic_from_moves_s": implied / bandwidth,
        "host_bandwidth": bandwidth,
    }
    return {"record": path, "tokens": run["tokens"], "rows": rows, "measured": measured}, figures, commands


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", action="append", required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--head-chunk-tokens", type=int, action="append", default=[], help="one more row each")
    ap.add_argument("--name", default="offload_plan_s7_hostmem_7b16l")
    ap.add_argument("--out", default="benchmarks/results/cpu")
    args = ap.parse_args()
    models, figures, commands = [], [], []
    for path in args.record:
        model, figs, cmds = model_record(path, args.layers, args.head_chunk_tokens)
        models.append(model)
        figures += figs
        commands += cmds
        for r in model["rows"]:
            print(model["tokens"], r)
        print(model["tokens"], "measured", model["measured"])
    table = [{"tokens": m["tokens"], **{k: v for k, v in r.items() if k != "blocks"}, **r["blocks"],
              "measured_step_s": round(m["measured"]["step_s"], 4),
              "step_over_measured": round(r["step_s"] / m["measured"]["step_s"], 3)}
             for m in models for r in m["rows"]]  # fmt: skip
    for m in models:  # the record's own moves and updates at the modeled bandwidth
        got = m["measured"]
        table.append({"tokens": m["tokens"], "step_s": round(got["host_traffic_from_moves_s"], 4), "bottleneck": "",
                      "model": "host memory alone: the record's measured moves + AdamW bytes at that bandwidth "
                      "(cpu_update_s: its step timer)",
                      "host_traffic_GB": round(got["host_traffic_from_moves_GB"], 2),
                      "host_bandwidth_GBps": round(m["measured"]["host_bandwidth"] / 1e9, 1),
                      "cpu_update_s": round(got["optim_update_s"], 4), "measured_step_s": round(got["step_s"], 4),
                      "step_over_measured": round(got["host_traffic_from_moves_s"] / got["step_s"], 3)})  # fmt: skip
    rec = make_record(
        name=args.name,
        figures=figures,
        config={"records": args.record, "layers": args.layers, "head_chunk_tokens": args.head_chunk_tokens},
        metrics={"models": models, "table": table, "commands": commands},
        notes="modeled by carina's planner (carina offload plan, shape estimate) with the rates each record's "
        "run probed; the host bandwidth is the least the probed AdamW rate implies (28 B/param); measured "
        "figures are the records' own",
    )
    print(write_record(rec, directory=Path(args.out)))


if __name__ == "__main__":
    main()
