"""The spill configuration's step with and without the spill pipeline, from the measured record's inputs (modeled).

Reads the committed spill record (the full 6.74B Llama under a 24 GiB GPU cap and a 64.5 GB host
budget, 29 of 32 blocks' AdamW state on NVMe: ``benchmarks/results/h200/s10/offload_s2_7b32l_spill_8k.json``)
and replays its plan through carina's simulator (:func:`carina.offload.simulator.simulate`) twice: with
the spilled state read, updated and written back in series on the CPU worker (``ModelProfile.spill_pipeline``
off: what that record ran) and with the spill pipeline (:mod:`carina.offload.spill`: write-back beside the
update, reads ahead in the one slot). The plan's decisions are the record's (``metrics.carina.plan.blocks``:
every block's weights resident, the last block's activations kept and the others recomputed, the last 29
blocks' state on NVMe, every block cast on the device), the rates the record's run probed
(``metrics.carina.hardware``), the profile the shape estimate of ``carina offload plan`` (``--tflops``
for its compute; the step is the disk's). Three disk rates:

* the record's plan's: the probe's read rate for both directions (what the planner priced; its
  prediction in the record was 56.64 s against 51.96 s measured);
* the tier's measured serial rates (``metrics.carina.disk``: read 1.75, write 2.39 GB/s): one rate that
  moves the step's bytes in the record's disk roofline term (46.5 s);
* the rate the tier ran at in the record's steps (its NVMe bytes per step over ``step_split_s.optim_disk_s``,
  49.65 s: 94% of the serial rates), which calibrates the serial model against the measured step.

Beside them, what ``carina offload plan`` itself predicts for this shape and these budgets and rates (its own
choices), and the command. One record, basis modeled::

    python benchmarks/offload/plan_spill_model.py \\
        --record benchmarks/results/h200/s10/offload_s2_7b32l_spill_8k.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.offload.estimate import ShapeEstimate, estimate_profile
from carina.offload.models import model_config
from carina.offload.simulator import Action, BlockPlan, Hardware, ModelProfile, simulate


def record_plan(counts: dict[str, int], layers: int) -> tuple[BlockPlan, ...]:
    """The record's plan decisions, block by block (the planner keeps and spills the last blocks first)."""
    assert counts["resident"] == layers and counts["cast_on_device"] == layers and counts["swap"] == 0
    keep, spilled = counts["keep"], counts["state_on_nvme"]
    return tuple(
        BlockPlan(resident=True, activation=Action.KEEP if i >= layers - keep else Action.RECOMPUTE,
                  state_on_nvme=i >= layers - spilled, cast_on_device=True)
        for i in range(layers)
    )  # fmt: skip


def predict(blocks: tuple[BlockPlan, ...], prof: ModelProfile, hw: Hardware, carry: bool) -> dict[str, Any]:
    """The simulated step with the spill pipeline off and on."""
    out = {}
    for label, on in (("serial", False), ("pipeline", True)):
        _, t = simulate(blocks, replace(prof, spill_pipeline=on), hw, 1, overlap=True, carry=carry)
        out[label] = {"step_s": t.predicted, "disk_s": t.disk, "cpu_optimizer_s": t.cpu_optimizer,
                      "compute_s": t.compute, "bottleneck": t.bottleneck}  # fmt: skip
    return out


def cli_plan(run: dict[str, Any], hw: Hardware, tflops: float) -> tuple[str, dict[str, Any]]:
    """``carina offload plan`` for the record's shape, budgets and rates: the command and its JSON."""
    cfg = run["config"]
    cmd = ["carina", "offload", "plan", "--model", "llama2-7b", "--layers", str(run["layers"]),
           "--tokens", str(run["tokens"]), "--tflops", str(tflops),
           "--device-budget", str(int(cfg["device_budget"] * (1 - cfg["allocator_headroom"]))),
           "--host-budget", str(cfg["host_budget"]), "--nvme-budget", str(cfg["nvme_budget"]),
           f"--h2d-gbps={hw.h2d / 1e9:.4g}", f"--d2h-gbps={hw.d2h / 1e9:.4g}",
           f"--optim-gparams={hw.optim / 1e9:.4g}", f"--disk-gbps={hw.disk / 1e9:.4g}",
           f"--fold-gelems={hw.fold / 1e9:.4g}", f"--cast-gelems={hw.cast / 1e9:.4g}",
           f"--host-mem-gbps={hw.host_mem / 1e9:.4g}", "--json"]  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "carina", *cmd[1:]], check=True, capture_output=True, text=True)
    return " ".join(cmd), json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", default="benchmarks/results/h200/s10/offload_s2_7b32l_spill_8k.json")
    ap.add_argument("--tflops", type=float, default=600.0, help="the shape estimate's compute rate")
    ap.add_argument("--name", default="offload_plan_s11_spill_pipeline_7b32l_8k")
    ap.add_argument("--out", default="benchmarks/results/cpu")
    args = ap.parse_args()
    record = json.loads(Path(args.record).read_text())
    m = record["metrics"]
    run = m["carina"]
    hw = Hardware(**run["hardware"])
    layers = run["layers"]
    prof = estimate_profile(model_config("llama2-7b", num_hidden_layers=layers), ShapeEstimate(run["tokens"], 2048,
                            args.tflops, 2))  # fmt: skip
    blocks = record_plan(run["plan"]["blocks"], layers)
    carry = not run["config"]["step_barrier"]
    disk = run["disk"]
    serial_rate = 2 / (1 / (disk["read_gbps"] * 1e9) + 1 / (disk["write_gbps"] * 1e9))  # same bytes each way
    moved = run["moved_per_step"]
    tier_rate = (moved["host->nvme"] + moved["nvme->host"]) / m["step_split_s"]["optim_disk_s"]
    rows = {
        "the record's plan's disk rate (read rate both ways)": predict(blocks, prof, hw, carry),
        "the tier's measured serial rates": predict(blocks, prof, replace(hw, disk=serial_rate), carry),
        "the tier's rate in the record's steps": predict(blocks, prof, replace(hw, disk=tier_rate), carry),
    }
    roofline, measured = m["roofline_terms_s"]["disk"], run["step_s"]
    figures = [
        Figure(name=f"predicted_step_s ({mode}, {rates})", value=row[mode]["step_s"], unit="s",
               higher_is_better=False, basis=Basis.MODELED, ceiling=roofline,
               ceiling_source="the record's disk roofline term (metrics.roofline_terms_s.disk: the step's NVMe "
               "bytes at the tier's measured serial rates)", peers={"the record's measured step": measured})
        for rates, row in rows.items() for mode in ("serial", "pipeline")
    ]  # fmt: skip
    command, plan = cli_plan(run, hw, args.tflops)
    figures.append(Figure(name="predicted_step_s (carina offload plan, its own choices)",
                          value=plan["predicted_s"]["step"], unit="s", higher_is_better=False, basis=Basis.MODELED,
                          ceiling=roofline, ceiling_source="as above"))  # fmt: skip
    metrics = {
        "rows": rows,
        "serial_rate_gbps": serial_rate / 1e9,
        "tier_rate_gbps": tier_rate / 1e9,
        "record_predicted_step_s": run["plan"]["predicted_s"]["step"],
        "measured_step_s": measured,
        "disk_roofline_s": roofline,
        "carina_offload_plan": {"command": command, "blocks": plan["blocks"], "predicted_s": plan["predicted_s"]},
    }
    rec = make_record(
        name=args.name, figures=figures, metrics=metrics,
        config={"record": args.record, "layers": layers, "tflops": args.tflops, "carry": carry,
                "blocks": run["plan"]["blocks"]},
        notes="modeled by carina's simulator from the record's plan decisions and probed rates (profile: the shape "
        "estimate); serial = read, update and write-back in series (what the record ran), pipeline = "
        "carina.offload.spill (not measured on a GPU yet)",
    )  # fmt: skip
    print(write_record(rec, directory=Path(args.out)))
    for rates, row in rows.items():
        print(rates, {k: round(v["step_s"], 3) for k, v in row.items()})
    print("carina offload plan:", round(plan["predicted_s"]["step"], 3), plan["blocks"])


if __name__ == "__main__":
    main()
