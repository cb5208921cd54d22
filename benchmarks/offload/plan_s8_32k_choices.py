"""Why the S2 32k plan recomputes: the planner's own simulation of its alternatives (modeled).

From a measured S2 record with a chunked head (``benchmarks/results/h200/s8/offload_s2_7b16l_head4096_32k.json``)
this builds the shape estimate of the run (``carina.offload.estimate``: llama2-7b at the record's layers,
tokens and head chunk) with the rates the run probed (``metrics.carina.hardware``, host memory included),
its planned device budget (``device_budget x (1 - allocator_headroom)``) and the compute rate that makes the
estimate's compute of the record's own choices (its kept blocks first, the rest recomputed) equal to the
record plan's profiled compute. Then it simulates, each with float32 gradients and with compute-dtype ones
(``ModelProfile.narrow_grads``):

* every block recomputed, and one block swapped instead (lead 2): what a swap costs and saves;
* the record's activation choices: its kept blocks first, the rest recomputed (every block streamed, cast on
  the device);
* the planner's plan (``make_plan``, as ``wrap`` calls it: cast ``auto``, updates carried past ``step()``).

One record, basis modeled::

    python benchmarks/offload/plan_s8_32k_choices.py \\
        --record benchmarks/results/h200/s8/offload_s2_7b16l_head4096_32k.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.offload.estimate import ShapeEstimate, estimate_profile
from carina.offload.models import model_config
from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import Action, BlockPlan, Hardware, ModelProfile, simulate


def _profile(run: dict, layers: int, tflops: float) -> ModelProfile:
    cfg = model_config("llama2-7b", num_hidden_layers=layers)
    est = ShapeEstimate(run["tokens"] // max(1, run["accum"]), 2048, tflops, 2, run.get("head_chunk_tokens", 0))
    return replace(estimate_profile(cfg, est), micro_batches=run["accum"], staging_bytes_per_param=0)


def _record_choices(run: dict, layers: int) -> tuple[BlockPlan, ...]:
    """The record's counts as blocks: its kept blocks first, the rest recomputed, nothing resident."""
    keep = run["plan"]["blocks"]["keep"]
    return tuple(BlockPlan(activation=Action.KEEP if i < keep else Action.RECOMPUTE, cast_on_device=True)
                 for i in range(layers))  # fmt: skip


def _row(label: str, blocks: tuple[BlockPlan, ...], prof: ModelProfile, hw: Hardware, lead: int) -> dict:
    events, t = simulate(blocks, prof, hw, 1, True, True, lead)
    return {
        "model": label,
        "step_s": round(t.predicted, 4),
        "bottleneck": t.bottleneck,
        "compute_s": round(t.compute, 4),
        "h2d_s": round(t.h2d, 4),
        "d2h_s": round(t.d2h, 4),
        "cpu_optimizer_s": round(t.cpu_optimizer, 4),
        "host_memory_s": round(t.host_memory, 4),
        "host_traffic_GB": round(t.host_traffic / 1e9, 2),
        "device_peak_GB": round(max(e.device_bytes for e in events) / 1e9, 2),
        "activation_lead": lead,
        "activations": "".join(b.activation.value[0] for b in blocks),
        "resident": "".join(str(int(b.resident)) for b in blocks),
        "cast_on_device": "".join(str(int(b.cast_on_device)) for b in blocks),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--name", default="offload_plan_s8_choices_7b16l_head4096_32k")
    ap.add_argument("--out", default="benchmarks/results/cpu")
    args = ap.parse_args()
    record = json.loads(Path(args.record).read_text())
    run = record["metrics"]["carina"]
    hw = Hardware(**{k: run["hardware"][k] for k in ("h2d", "d2h", "optim", "disk", "grad_add", "fold", "cast",
                                                      "host_mem")})  # fmt: skip
    ours = _record_choices(run, args.layers)
    probe = simulate(ours, _profile(run, args.layers, 1000.0), hw, 1, True, True)[1].compute
    tflops = 1000.0 * probe / run["plan"]["predicted_s"]["compute"]
    budget = int(run["config"]["device_budget"] * (1 - run["config"]["allocator_headroom"]))
    rows, figures = [], []
    for grads, narrow in (("float32", False), ("compute-dtype", True)):
        prof = replace(_profile(run, args.layers, tflops), narrow_grads=narrow)
        every = tuple(BlockPlan(cast_on_device=True) for _ in prof.blocks)
        swap = tuple(replace(b, activation=Action.SWAP) if i == args.layers // 2 else b for i, b in enumerate(every))
        plan = make_plan(prof, PlanBudgets(device=budget, host=int(run["config"]["host_budget"])), hw,
                         cast="auto", carry=True)  # fmt: skip
        for label, blocks, lead in (
            ("every block recomputed", every, 2),
            (f"block {args.layers // 2} swapped, the rest recomputed", swap, 2),
            ("the record's choices (first blocks kept)", ours, 1),
            ("the planner's plan", plan.blocks, plan.act_lead),
        ):
            rows.append({"gradients": grads, **_row(label, blocks, prof, hw, lead)})
        figures.append(Figure(name=f"predicted_step_s 32k planner, {grads} gradients", value=plan.time.predicted,
                              unit="s", higher_is_better=False, basis=Basis.MODELED,
                              ceiling=record["metrics"]["ideal_step_s"],
                              ceiling_source="the record's ideal step (metrics.ideal_step_s)",
                              peers={"the record's measured step": run["step_s"],
                                     "the record plan's prediction": run["plan"]["predicted_s"]["step"]}))  # fmt: skip
    for r in rows:
        print(r)
    rec = make_record(
        name=args.name,
        figures=figures,
        config={"record": args.record, "layers": args.layers, "tflops": tflops, "device_budget": budget},
        metrics={"rows": rows, "measured_step_s": run["step_s"], "record_plan": run["plan"]},
        notes="modeled: carina's simulator on the shape estimate with the record's probed rates; the compute "
        "rate matches the record plan's profiled compute for the record's own choices",
    )
    print(write_record(rec, directory=Path(args.out)))


if __name__ == "__main__":
    main()
