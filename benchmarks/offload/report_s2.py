"""Records and a summary table from what the S2 phases left (see bench_s2.py).

A phase that timed out or failed left no JSON (or one with ``error``): its row says so.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from carina.core.bench import Basis, Figure, make_record, write_record

IDEAL_HOW = (
    "plain PyTorch with unlimited memory (fp32 weights, bf16 autocast, fused GPU AdamW, no checkpointing), "
    "measured {where} at {trunc} layers of the same shape; per micro-batch time fitted as a + b*layers, "
    "plus the measured GPU optimizer time per parameter (layer truncation: the full model does not fit one GPU "
    "with fp32 AdamW states)"
)


def _ideal_how(args: Any, fit: dict[str, Any]) -> str:
    """How the ideal was measured: in this run, or (``--ideal-from``) in the run that file names."""
    source = getattr(args, "ideal_from", "")
    where = f"in an earlier run ({args.ideal_source or source}), NOT in this run" if source else "in this run"
    return IDEAL_HOW.format(where=where, trunc="/".join(map(str, fit["layers"])))


def _load(work: Path, name: str) -> dict[str, Any] | None:
    path = work / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def ideal_model(ideal: dict[str, Any]) -> dict[str, float] | None:
    """``a``, ``b`` (s per micro-batch and per layer) and the optimizer's s/param from the truncations."""
    points = sorted((int(k), v) for k, v in ideal.items() if k.isdigit())
    if len(points) < 2:
        return None
    (l1, p1), (l2, p2) = points[0], points[-1]
    t1, t2 = statistics.median(p1["fb_s"]), statistics.median(p2["fb_s"])
    b = (t2 - t1) / (l2 - l1)
    return {
        "a": t1 - b * l1,
        "b": b,
        "opt_per_param": statistics.median(p2["opt_s"]) / p2["params"],
        "layers": [l1, l2],
    }


def ideal_step(fit: dict[str, float], layers: int, params: int, micro_batches: int) -> tuple[float, float]:
    """(forward+backward seconds, whole step seconds) of the ideal."""
    fb = micro_batches * (fit["a"] + fit["b"] * layers)
    return fb, fb + fit["opt_per_param"] * params


def _record(args: Any, **kw: Any) -> dict[str, Any]:
    """``make_record``; with ``--environment-from RECORD`` the report is recomputed away from the device.

    The phases' JSON were measured on the machine that RECORD names: its environment (and so its machine
    label) is carried over, and ``metrics.recomputed_from`` names RECORD's commit and time, while the
    record's own ``git_sha`` is the commit of the report code that recomputed it.
    """
    src = getattr(args, "environment_from", "")
    if not src:
        return make_record(**kw)
    origin = json.loads(Path(src).read_text())
    metrics = {**kw.pop("metrics", {}), "recomputed_from": {
        "record": origin["name"], "git_sha": origin["git_sha"], "created": origin["created"],
        "machine": origin["machine"]["label"]}}  # fmt: skip
    return make_record(environment=origin["environment"], metrics=metrics, **kw)


def ideal_micro_batches(tokens: int, args: Any) -> int:
    """Micro-batches of the ideal's size (``args.micro`` sequences of ``args.seq``) in ``tokens``."""
    return max(1, tokens // (args.micro * args.seq))


def roofline(run: dict[str, Any], rates: dict[str, float], compute_s: float) -> dict[str, float]:
    """Lower bounds on the step: compute, each PCIe direction with carina's bytes, CPU AdamW, disk."""
    moved = run.get("moved_per_step", {})
    terms = {"compute": compute_s, "cpu_adamw": run["params"] / rates["cpu_adamw_params_per_s"]}
    if "h2d_gbps" in rates:
        terms["h2d"] = moved.get("host->device", 0) / (rates["h2d_gbps"] * 1e9)
        terms["d2h"] = moved.get("device->host", 0) / (rates["d2h_gbps"] * 1e9)
    hw = run.get("hardware") or {}
    disk = run.get("disk") or {}  # the spill phase's measured tier rates
    if "write_gbps" in disk:
        terms["disk"] = moved.get("host->nvme", 0) / (disk["write_gbps"] * 1e9)
        terms["disk"] += moved.get("nvme->host", 0) / (disk["read_gbps"] * 1e9)
    elif moved.get("host->nvme", 0) + moved.get("nvme->host", 0):
        terms["disk"] = (moved.get("host->nvme", 0) + moved.get("nvme->host", 0)) / hw.get("disk", 1.5e9)
    return terms


#: Host memory bytes one AdamW update reads and writes per parameter (float32 master, gradient, m, v).
ADAMW_HOST_BYTES = 28


def host_memory_term(run: dict[str, Any]) -> float | None:
    """Seconds of a step's host memory traffic at the run's probed bandwidth (None: not probed).

    The traffic: AdamW's bytes over the parameters plus every byte moved between host and the
    other tiers per step (``moved_per_step``), each crossing host memory once.
    """
    bandwidth = (run.get("hardware") or {}).get("host_mem")
    if not bandwidth:
        return None
    moved = sum((run.get("moved_per_step") or {}).values())
    return (ADAMW_HOST_BYTES * run["params"] + moved) / bandwidth


def disk_mixed_term(run: dict[str, Any]) -> float | None:
    """Seconds of a step's NVMe traffic at the probe's mixed read+write rate (None: not probed)."""
    mixed = (run.get("disk") or {}).get("mixed_gbps")
    moved = run.get("moved_per_step") or {}
    if not mixed:
        return None
    return (moved.get("host->nvme", 0) + moved.get("nvme->host", 0)) / (mixed * 1e9)


def _host(run: dict[str, Any]) -> dict[str, Any]:
    host = dict(run.get("host", {}))
    planned = ((run.get("plan") or {}).get("bytes") or {}).get("host")
    host["planned_host_bytes"] = planned
    if planned:  # RSS of the planned steps (setup peaks, e.g. the model's init copy, are reported apart)
        host["rss_over_planned"] = host.get("process_rss_peak_sampled", 0) / planned
    return host


def carina_record(
    args: Any, work: Path, tokens: int, rates: dict[str, float], fit: dict[str, float] | None, prefix: str = ""
) -> str:
    run = _load(work, f"{prefix}carina_{tokens}")
    fsdp = _load(work, f"fsdp2_{tokens}") if not prefix else None
    tag = args.spill_tag if prefix else args.tag
    name = f"offload_s2_{tag}_{prefix}{_label(tokens)}"
    if run is None or "error" in run:
        why = (run or {}).get("error", "the phase left no result (timed out or crashed: see s2.log)")
        rec = _record(args, name=name, figures=[Figure(name="tokens_per_s", value=0.0, unit="tokens/s")],
                          config=_config(args, tokens), metrics={"status": "failed", "reason": why})  # fmt: skip
        write_record(rec, directory=Path(args.out))
        return f"| carina {args.tag} | {tokens} | failed: {why[:60]} | | | | |"
    peers: dict[str, float] = {}
    ideal_s = fb_s = None
    terms: dict[str, float] = {}
    # The fit is per micro-batch of the ideal's own size (--micro sequences): count those, whatever split
    # carina ran (session 6 ran 32k as one micro-batch of 16 sequences; counting carina's accumulation
    # priced the ideal's 32k step as one 8k micro-batch).
    ideal_micro = ideal_micro_batches(tokens, args)
    if fit is not None:
        fb_s, ideal_s = ideal_step(fit, run["layers"], run["params"], ideal_micro)
        terms = roofline(run, rates, fb_s)
        peers["roofline (max of compute, PCIe, CPU AdamW, disk)"] = tokens / max(terms.values())
        if "disk" in terms:
            peers["disk roofline (NVMe bytes per step at the measured tier rates)"] = tokens / terms["disk"]
    if fsdp is not None:
        peers["fsdp2_cpu_offload"] = fsdp.get("tokens_per_s", 0.0)
    figs = [
        Figure(name="tokens_per_s", value=run["tokens_per_s"], unit="tokens/s",
               ceiling=tokens / ideal_s if ideal_s else None,
               ceiling_source=_ideal_how(args, fit) if fit else "", peers=peers),
        Figure(name="tflops", value=6 * run["params"] * tokens / run["step_s"] / 1e12, unit="TFLOP/s"),
        Figure(name="peak_host_rss", value=run["host"]["process_rss_peak_sampled"], unit="B", higher_is_better=False),
    ]  # fmt: skip
    pred = ((run.get("plan") or {}).get("predicted_s") or {}).get("step")
    if pred:
        figs.append(Figure(name="predicted_step_s", value=pred, unit="s", higher_is_better=False, basis=Basis.MODELED))
    metrics = {
        "carina": run,
        "fsdp2_cpu_offload": fsdp,
        "ideal_step_s": ideal_s,
        "ideal_fit": fit,
        "ideal_full_7b_32_layers_step_s": (
            ideal_step(fit, 32, 6_738_415_616, ideal_micro)[1] if fit and args.model == "llama2-7b" else None
        ),
        "roofline_terms_s": terms,
        "roofline_step_s": max(terms.values()) if terms else None,
        "fraction_of_ideal": ideal_s / run["step_s"] if ideal_s else None,
        "fraction_of_roofline": max(terms.values()) / run["step_s"] if terms else None,
        # beside the roofline, not in it: the host memory traffic at the run's probed bandwidth
        "host_memory_term_s": host_memory_term(run),
        "fraction_of_roofline_with_host_memory": (
            max(*terms.values(), host_memory_term(run) or 0.0) / run["step_s"] if terms else None
        ),
        # beside the roofline: the NVMe bytes at the probe's mixed rate (reads and writes at once, as spilled)
        "disk_mixed_term_s": disk_mixed_term(run),
        "host_memory": _host(run),
        "rates": rates,
        "step_split_s": run.get("step_split"),  # median phase split of the timed steps (carina.offload.timing)
        "optim_rates": run.get("optim_rates"),
        "plan_vs_measured_s": plan_vs_measured(run),
    }
    rec = _record(args, name=name, figures=figs, config=_config(args, tokens, run), metrics=metrics, notes=_NOTES)
    write_record(rec, directory=Path(args.out))
    fr = metrics["fraction_of_ideal"]
    rf = metrics["fraction_of_roofline"]
    fs = f"{peers['fsdp2_cpu_offload']:.0f}" if "fsdp2_cpu_offload" in peers else "-"
    host = run["host"]["process_rss_peak_sampled"] / 1e9
    label = f"{tag} spill" if prefix else tag
    return (f"| carina {label} | {tokens} | {run['tokens_per_s']:.0f} | {_pct(fr)} | {_pct(rf)} | {fs} | "
            f"{host:.1f} GB |")  # fmt: skip


#: The plan's CPU terms and the step timer's host totals that measure the same work.
_CPU_TERMS = {"cpu_update": "optim_update_s", "cpu_fold": "optim_fold_s", "cpu_cast": "optim_cast_s",
              "disk": "optim_disk_s"}  # fmt: skip


def plan_vs_measured(run: dict[str, Any]) -> dict[str, list[float | None]]:
    """[predicted, measured] seconds per step: the step, and each CPU term against the step timer's."""
    pred = (run.get("plan") or {}).get("predicted_s") or {}
    split = run.get("step_split") or {}
    out: dict[str, list[float | None]] = {"step": [pred.get("step"), run.get("step_s")]}
    for term, timer in _CPU_TERMS.items():
        out[term] = [pred.get(term), split.get(timer)]
    return out


def _label(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens >= 1024 else f"{tokens}tok"


def _pct(x: float | None) -> str:
    return f"{100 * x:.0f}%" if x else "-"


def _config(args: Any, tokens: int, run: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": args.model,
        "layers": (run or {}).get("layers") or args.layers,
        "params": (run or {}).get("params"),
        "tokens_per_step": tokens,
        "seq": args.seq,
        # what carina ran (tokens / (micro-batches x seq)); the ideal's micro-batch is ideal_micro_batch_sequences
        "micro_batch_sequences": tokens // (run["accum"] * args.seq) if run and run.get("accum") else args.micro,
        "ideal_micro_batch_sequences": args.micro,
        "gpu_cap_gib": args.cap,
        "carina_device_budget": "90% of the cap",
        "host_budget_gb": (((run or {}).get("config") or {}).get("host_budget") or args.host_budget * 1e9) / 1e9,
        "init": "seeded float32 random init on the GPU, moved to the host",
    }


_NOTES = (
    "tokens/s = tokens per optimizer step / median step time after carina's 2 profiling steps and 1 warm-up step. "
    "Ideal and roofline are defined in the figure's ceiling_source and metrics.roofline_terms_s; the roofline "
    "uses carina's own bytes moved per step at the measured pinned bandwidths, the CPU AdamW rate measured on "
    "this machine (fused, all threads) and the ideal's forward+backward time. Host memory (metrics.host_memory): "
    "process_rss_peak_sampled = this process's VmRSS peak over the planned steps, *_setup = peaks before them "
    "(model init copy, wrap, profiling), machine_used_peak = MemTotal - MemAvailable (sampled every 0.25 s; "
    "it counts pinned memory whichever way the driver maps it), planned_host_bytes = the plan's host bytes; "
    "metrics.carina.pinned_slab_bytes = carina's pinned slabs."
)


def notax_record(args: Any, work: Path, tokens: int) -> str:
    plain = _load(work, f"notax_plain_{tokens}")
    run = _load(work, f"notax_carina_{tokens}")
    model = "llama-3b" if args.model != "tiny" else "tiny"
    name = f"offload_s2_{model.removeprefix('llama-')}_notax_{_label(tokens)}"
    if run is None or plain is None or "error" in run:
        why = "phase did not finish (budget or failure: see s2.log)" if run is None else run.get("error", "")
        return f"| carina 3B no budget | {tokens} | {why} | | | | |"
    peers = {"plain": plain["tokens_per_s"]} if "tokens_per_s" in plain else {}
    fig = Figure(name="tokens_per_s", value=run["tokens_per_s"], unit="tokens/s",
                 ceiling=plain.get("tokens_per_s"), ceiling_source="plain PyTorch, everything on the GPU, same "
                 "micro-batches, measured in the same process", peers=peers)  # fmt: skip
    micro = run["tokens"] // (run["accum"] * args.seq)
    cfg = {**_config(args, tokens, run), "model": model, "layers": run["layers"], "micro_batch_sequences": micro}
    cfg.update(gpu_cap_gib=None, carina_device_budget="none (the whole GPU)")
    cfg["carina_plan_mode"] = (run.get("plan") or {}).get("mode", "offload")  # resident: nothing offloaded
    metrics = {"carina": run, "plain": plain, "host_memory": _host(run)}
    write_record(_record(args, name=name, figures=[fig], config=cfg, metrics=metrics, notes=_NOTES),
                 directory=Path(args.out))  # fmt: skip
    ratio = run["tokens_per_s"] / plain["tokens_per_s"] if "tokens_per_s" in plain else None
    return f"| carina 3B no budget | {tokens} | {run['tokens_per_s']:.0f} | {_pct(ratio)} of plain | | | |"


def report(args: Any) -> None:
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    source = getattr(args, "ideal_from", "")
    ideal = (json.loads(Path(source).read_text()) if source else _load(work, "ideal")) or {}
    rates = ideal.get("rates", {})
    fit = ideal_model(ideal) if ideal else None
    lines = [
        "| system | tokens/step | tokens/s | of ideal | of roofline | FSDP2 tokens/s | host RSS (planned steps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for tokens in args.report_tokens:
        lines.append(carina_record(args, work, tokens, rates, fit))
    if _load(work, f"spill_carina_{args.tokens}"):
        lines.append(carina_record(args, work, args.tokens, rates, fit, prefix="spill_"))
    if _load(work, f"notax_carina_{args.tokens}") or _load(work, f"notax_plain_{args.tokens}"):
        lines.append(notax_record(args, work, args.tokens))
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    sys.stdout.flush()
