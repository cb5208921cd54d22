"""``carina offload``: plan offloaded training before running it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from carina.offload.planner import Plan, PlanBudgets
    from carina.offload.simulator import StepTime
    from carina.offload.splits import Split

app = typer.Typer(help="Profile, plan and inspect offloaded training.", no_args_is_help=True, add_completion=False)


@app.command()
def plan(
    model: Annotated[
        str, typer.Option(help="Preset (tiny, demo, llama-1b, llama2-7b, ...) or JSON file.")
    ] = "llama2-7b",
    tokens: Annotated[int, typer.Option(help="Tokens per micro-batch.")] = 8192,
    micro_batches: Annotated[int, typer.Option(help="Micro-batches per optimizer step (accumulation).")] = 1,
    seq_len: Annotated[int, typer.Option(help="Sequence length.")] = 2048,
    device_budget: Annotated[str, typer.Option(help="Device memory budget, e.g. 24GB.")] = "24GB",
    host_budget: Annotated[str | None, typer.Option(help="Host RAM budget (default unlimited).")] = None,
    nvme_budget: Annotated[str, typer.Option(help="NVMe budget for optimizer-state spill.")] = "0",
    activations: Annotated[str, typer.Option(help="plan, keep, swap or recompute.")] = "plan",
    prefetch_depth: Annotated[int, typer.Option(help="Blocks fetched ahead.")] = 1,
    dtype_bytes: Annotated[int, typer.Option(help="Bytes per compute element (2 = bf16).")] = 2,
    tflops: Annotated[float, typer.Option(help="Device TFLOP/s for the compute estimate.")] = 400.0,
    h2d_gbps: Annotated[float, typer.Option(help="Host-to-device GB/s.")] = 25.0,
    d2h_gbps: Annotated[float, typer.Option(help="Device-to-host GB/s.")] = 25.0,
    optim_gparams: Annotated[float, typer.Option(help="CPU optimizer Gparam/s.")] = 2.0,
    disk_gbps: Annotated[float, typer.Option(help="NVMe GB/s.")] = 1.5,
    grad_add_gelems: Annotated[float, typer.Option(help="CPU gradient-accumulation Gelem/s.")] = 3.0,
    cast_gelems: Annotated[float, typer.Option(help="CPU cast of masters into the host copy, Gelem/s.")] = 10.0,
    fold_gelems: Annotated[float, typer.Option(help="CPU fold of staged gradients, Gelem/s.")] = 10.0,
    host_mem_gbps: Annotated[
        float,
        typer.Option(
            help="Host memory GB/s (read plus written), shared by the CPU optimizer and the pinned copies "
            "(0: the least the optimizer's rate implies, optim_gparams x its bytes per parameter; -1: not modeled)."
        ),
    ] = 0.0,
    layers: Annotated[int, typer.Option(help="Decoder layers (0: the preset's).")] = 0,
    head_chunk_tokens: Annotated[
        int,
        typer.Option(help="Tokens per chunk of the head and loss (carina.offload.chunked_lm_loss; 0: plain loss)."),
    ] = 0,
    convert_on_host: Annotated[
        bool,
        typer.Option(
            "--convert-on-host/--convert-on-device",
            help="Fold and cast on the CPU (grad_fold, param_cast host) or on the device (the library default).",
        ),
    ] = False,
    narrow_grads: Annotated[
        bool,
        typer.Option(
            "--narrow-grads/--float32-grads",
            help="With one micro-batch, gradients leave the device in the compute dtype and the update upcasts "
            "them, or as float32 (the library default: the narrow update measured slower on an H200).",
        ),
    ] = False,
    step_barrier: Annotated[
        bool,
        typer.Option(
            "--step-barrier/--no-step-barrier",
            help="step() waits for every update, or updates carry over (the library default).",
        ),
    ] = False,
    tokens_per_step: Annotated[
        int,
        typer.Option(
            help="Tokens per optimizer step: plan every split into micro-batches of whole sequences and "
            "take the fastest that fits (replaces --tokens and --micro-batches; 0: off)."
        ),
    ] = 0,
    resident: Annotated[
        str,
        typer.Option(help="auto: train resident (no offload) when everything fits the device; on: must; off: never."),
    ] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Plan a model from its shape (modeled): bytes per tier, predicted step split, bottleneck.

    A configuration that cannot fit exits with status 2 and says what would fit.
    """
    from dataclasses import replace

    from carina.core.errors import CarinaError, ConfigError
    from carina.core.progress import emit_json
    from carina.memory.tiers import parse_bytes
    from carina.offload.estimate import ShapeEstimate, estimate_profile, nominal_hardware
    from carina.offload.models import model_config, param_count
    from carina.offload.planner import PlanBudgets, make_plan
    from carina.offload.splits import best_split, plan_splits

    hint: dict[str, Any] | None = None
    try:
        try:
            budgets = PlanBudgets(
                device=parse_bytes(device_budget),
                host=None if host_budget is None else parse_bytes(host_budget),
                nvme=parse_bytes(nvme_budget),
            )
        except ValueError as exc:
            raise ConfigError(str(exc), key="budget") from None
        _check_choices(micro_batches, activations, resident, head_chunk_tokens)
        cfg = model_config(model, **({"num_hidden_layers": layers} if layers else {}))
        hw = replace(nominal_hardware(h2d_gbps, d2h_gbps, optim_gparams, disk_gbps), grad_add=grad_add_gelems * 1e9,
                     cast=cast_gelems * 1e9, fold=fold_gelems * 1e9)  # fmt: skip
        hw = replace(hw, host_mem=_host_bandwidth(host_mem_gbps, hw.optim))

        def plan_for(tokens: int, micro_batches: int, chunk: int = head_chunk_tokens) -> Plan:
            staged = micro_batches > 1 or convert_on_host  # host staging only where gradients are folded/added there
            est = ShapeEstimate(tokens, seq_len, tflops, dtype_bytes, chunk)
            prof = replace(estimate_profile(cfg, est),
                           micro_batches=micro_batches, staging_bytes_per_param=dtype_bytes if staged else 0,
                           fold_on_device=not convert_on_host, rest_cast_on_device=not convert_on_host,
                           narrow_grads=narrow_grads)  # fmt: skip
            return make_plan(prof, budgets, hw, policy=activations, prefetch_depth=prefetch_depth,
                             cast="host" if convert_on_host else "auto", carry=not step_barrier,
                             resident=resident)  # fmt: skip

        splits: list[Split] = []
        if tokens_per_step:
            splits = plan_splits(tokens_per_step, seq_len, plan_for)
            best = best_split(splits)
            tokens, micro_batches = best.tokens, best.micro_batches
        with_chunk = None if head_chunk_tokens else (lambda c: plan_for(tokens, micro_batches, c))
        try:
            result = plan_for(tokens, micro_batches)
        except CarinaError:
            hint = head_chunk_hint(None, with_chunk, tokens)
            raise
    except CarinaError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        if hint is not None:  # the plain loss did not fit; the chunked head does
            typer.secho(_hint_line(hint), err=True)
        raise typer.Exit(2) from None
    hint = head_chunk_hint(result, with_chunk, tokens)
    summary = {"model": model, "params": param_count(cfg), "basis": "modeled", "tokens": tokens,
               "micro_batches": micro_batches, "head_chunk_tokens": head_chunk_tokens, **result.summary(),
               "head_chunk_hint": hint}  # fmt: skip
    if splits:
        summary["splits"] = [r.row() for r in splits]
    if json_out:
        emit_json(summary)
        return
    _show(summary, result, budgets, splits, tokens_per_step, hint)


def _show(
    summary: dict[str, Any],
    result: Plan,
    budgets: PlanBudgets,
    splits: list[Split],
    tokens_per_step: int,
    hint: dict[str, Any] | None,
) -> None:
    """The plan as tables: the splits tried, bytes per tier, the predicted step split, the hint."""
    from carina.core.progress import console, print_table
    from carina.memory.tiers import format_bytes

    t = result.time
    out = console()
    if splits:
        print_table([{"micro-batches": r.micro_batches, "tokens each": r.tokens,
                      "step s": "-" if r.step_s is None else f"{r.step_s:.3f}",
                      "bottleneck": r.plan.time.bottleneck if r.plan else r.reason[:60]} for r in splits],
                    columns=["micro-batches", "tokens each", "step s", "bottleneck"],
                    title=f"splits of {tokens_per_step} tokens per step (the fastest that fits: below)")  # fmt: skip
    out.print(f"[bold]{summary['model']}[/]: {summary['params'] / 1e9:.2f}B parameters, {summary['micro_batches']} x "
              f"{summary['tokens']} tokens per step (modeled)")  # fmt: skip
    out.print(result.tier)
    counts = result.counts()
    out.print(
        f"blocks: {counts['streamed']} streamed, {counts['resident']} resident; activations keep {counts['keep']}"
        f" / swap {counts['swap']} / recompute {counts['recompute']}; optimizer state on NVMe"
        f" {counts['state_on_nvme']}; gradients accumulated on the device {counts['grad_on_device']};"
        f" swapped activations fetched {result.act_lead} block(s) ahead"
    )
    rows = [
        {"tier": "device", "bytes": format_bytes(result.device_peak), "budget": format_bytes(budgets.device or 0)},
        {"tier": "host", "bytes": format_bytes(result.host_bytes),
         "budget": "unlimited" if budgets.host is None else format_bytes(budgets.host)},
        {"tier": "nvme", "bytes": format_bytes(result.nvme_bytes), "budget": format_bytes(budgets.nvme)},
    ]  # fmt: skip
    print_table(rows, columns=["tier", "bytes", "budget"], title="bytes per tier")
    parts = {"compute": t.compute, "h2d": t.h2d, "d2h": t.d2h, "cpu optimizer": t.cpu_optimizer,
             "  cpu update": t.cpu_update, "  cpu fold/add": t.cpu_fold, "  cpu cast": t.cpu_cast,
             "disk": t.disk, "host memory": t.host_memory}  # fmt: skip
    out.print(_host_line(t))
    print_table([{"resource": k, "seconds": f"{v:.3f}"} for k, v in parts.items()], columns=["resource", "seconds"],
                title=f"predicted step {t.predicted:.3f} s, bottleneck {t.bottleneck}")  # fmt: skip
    if hint is not None:
        out.print(_hint_line(hint))


def head_chunk_hint(plain: Plan | None, with_chunk: Callable[[int], Plan] | None, tokens: int) -> dict[str, Any] | None:
    """The chunked head's plan when it beats the plain loss's (or fits where that did not); else None.

    ``plain`` is the plan with the plain loss (None: it did not fit), ``with_chunk`` plans the same
    micro-batches with a head chunk (None: the user chose the chunk). Both are modeled.
    """
    from carina.core.errors import CarinaError
    from carina.offload.chunkloss import AUTO_CHUNK_TOKENS

    if with_chunk is None or tokens <= AUTO_CHUNK_TOKENS:
        return None
    try:
        chunked = with_chunk(AUTO_CHUNK_TOKENS)
    except CarinaError:
        return None
    if plain is not None and chunked.time.predicted >= plain.time.predicted:
        return None
    return {"head_chunk_tokens": AUTO_CHUNK_TOKENS, "predicted_step_s": chunked.time.predicted,
            "plain_step_s": None if plain is None else plain.time.predicted, "blocks": chunked.counts()}  # fmt: skip


def _hint_line(hint: dict[str, Any]) -> str:
    n, b = hint["head_chunk_tokens"], hint["blocks"]
    plain = hint["plain_step_s"]
    than = "where the plain loss does not fit" if plain is None else f"against {plain:.3f} s"
    return (
        f"hint: the chunked head (--head-chunk-tokens {n}; in your loop carina.offload.chunked_lm_loss with "
        f"Config(head_chunk_tokens={n}); carina train --head-chunk-tokens {n}) predicts "
        f"{hint['predicted_step_s']:.3f} s {than}: activations keep {b['keep']} / swap {b['swap']} / recompute "
        f"{b['recompute']} (modeled)"
    )


def _host_bandwidth(gbps: float, optim: float) -> float:
    """Bytes/s for the plan: given, the least AdamW's rate implies (0) or not modeled (negative)."""
    from carina.offload.profiler import host_memory_rate

    return gbps * 1e9 if gbps > 0 else host_memory_rate(optim, 8) if gbps == 0 else 0.0


def _host_line(t: StepTime) -> str:
    from carina.memory.tiers import format_bytes

    traffic = f"host memory traffic {format_bytes(t.host_traffic)} per step"
    if not t.host_bandwidth:
        return f"{traffic} (bandwidth not modeled)"
    return f"{traffic} at {t.host_bandwidth / 1e9:.1f} GB/s (the CPU optimizer's passes, every pinned copy, spill I/O)"


def _check_choices(micro_batches: int, activations: str, resident: str, head_chunk_tokens: int = 0) -> None:
    from carina.core.errors import ConfigError

    if head_chunk_tokens < 0:
        raise ConfigError("head_chunk_tokens must be >= 0 (0: the plain loss)", key="head_chunk_tokens")

    if micro_batches < 1:
        raise ConfigError("micro_batches must be >= 1", key="micro_batches")
    if activations not in ("plan", "keep", "swap", "recompute"):
        raise ConfigError(f"unknown activation policy {activations!r}", key="activations")
    if resident not in ("auto", "on", "off"):
        raise ConfigError(f"resident must be auto, on or off, got {resident!r}", key="resident")


@app.command()
def presets(json_out: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False) -> None:
    """List the model presets and their sizes."""
    from carina.core.progress import emit_json, print_table
    from carina.offload.models import PRESETS, model_config, param_count

    rows = [{"name": n, "params": param_count(model_config(n)), **PRESETS[n]} for n in PRESETS]
    if json_out:
        emit_json(rows)
    else:
        print_table(rows, columns=["name", "params", "hidden_size", "num_hidden_layers", "vocab_size"])
