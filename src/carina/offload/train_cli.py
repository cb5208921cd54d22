"""``carina train``: train a causal LM larger than the device budget (the main job).

``carina train --demo`` runs the embedded demo: a 12M-parameter Llama built
from its config (random init, no downloads) trained for a few steps within a
20 MiB device budget on whatever device exists, then says how it went.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Train a model larger than GPU memory (the main job).", add_completion=False)

_Size = Annotated[str | None, typer.Option(help="Bytes, e.g. 24GB, 512MiB.")]


def _size(text: str | None, key: str) -> int | None:
    from carina.core.errors import ConfigError
    from carina.memory.tiers import parse_bytes

    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise ConfigError(str(exc), key=key) from None


def _build_config(demo: bool, config: Path | None, opts: dict[str, Any], offload: dict[str, Any]) -> Any:
    import dataclasses

    from carina.offload.job import DEMO, TrainConfig

    if config is not None:
        text = config.read_text()
        base = TrainConfig.from_toml(text) if config.suffix == ".toml" else TrainConfig.from_json(text)
    else:
        base = DEMO if demo else TrainConfig()
    data = base.to_dict()
    data["offload"].update({k: v for k, v in offload.items() if v is not None})
    data.update({k: v for k, v in opts.items() if v is not None})
    out = TrainConfig.from_dict(data)
    return dataclasses.replace(out)


@app.command()
def train(
    demo: Annotated[bool, typer.Option("--demo", help="Run the embedded demo (small Llama, small budget).")] = False,
    config: Annotated[Path | None, typer.Option(help="A TrainConfig as TOML or JSON.")] = None,
    model: Annotated[str | None, typer.Option(help="Preset (tiny, demo, llama2-7b, ...) or JSON file.")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="Sequences per micro-batch.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Tokens per sequence.")] = None,
    lr: Annotated[float | None, typer.Option(help="AdamW learning rate.")] = None,
    data: Annotated[Path | None, typer.Option(help="Text file used as byte tokens.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda[:N].")] = None,
    device_budget: _Size = None,
    host_budget: _Size = None,
    nvme_path: Annotated[Path | None, typer.Option(help="Directory for optimizer-state spill.")] = None,
    nvme_budget: _Size = None,
    activations: Annotated[str | None, typer.Option(help="plan, keep, swap or recompute.")] = None,
    prefetch_depth: Annotated[int | None, typer.Option(help="Blocks fetched ahead.")] = None,
    grad_accumulation: Annotated[int | None, typer.Option(help="Micro-batches per step.")] = None,
    max_grad_norm: Annotated[float | None, typer.Option(help="Global-norm clipping.")] = None,
    loss_chunk_tokens: Annotated[
        int | None,
        typer.Option(
            "--head-chunk-tokens",
            "--loss-chunk-tokens",
            help="Tokens per chunk of the head and loss (carina.offload.chunked_lm_loss; the plan sizes the "
            "head's workspace as one chunk's): -1 auto (chunks of 4096 once a micro-batch's float32 logits "
            "reach 1 GiB), 0 the plain loss.",
        ),
    ] = None,
    disagg: Annotated[
        bool, typer.Option("--disagg", help="Disaggregated data parallel: workers + parameter-server shards.")
    ] = False,
    workers: Annotated[
        int | None, typer.Option(help="With --disagg: worker processes per host (default 2, or the hostfile's slots).")
    ] = None,
    ps_shards: Annotated[int, typer.Option(help="With --disagg: parameter-server shards per host.")] = 2,
    hosts: Annotated[
        Path | None, typer.Option(help="With --disagg: hostfile, 'host[:port] slots=N' per line (line = node rank).")
    ] = None,
    node_rank: Annotated[int | None, typer.Option(help="With --hosts: this host's line in the file, from 0.")] = None,
    rdzv: Annotated[
        str | None, typer.Option(help="With --disagg: env:// reads MASTER_ADDR, MASTER_PORT, WORLD_SIZE (hosts), RANK.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary only.")] = False,
) -> None:
    """Train a causal LM with carina.offload and report speed and memory per tier."""
    from carina.core.errors import CarinaError

    if disagg:
        _run_disagg(dict(workers=workers, ps_shards=ps_shards, hosts=hosts, node_rank=node_rank, rdzv=rdzv,
                         device=device, lr=lr), steps or 5, json_out)  # fmt: skip
        return
    if hosts is not None or node_rank is not None or rdzv is not None:
        typer.secho("error: --hosts, --node-rank and --rdzv need --disagg", err=True, fg=typer.colors.RED)
        raise typer.Exit(2)

    try:
        cfg = _build_config(
            demo,
            config,
            dict(
                model=model,
                steps=steps,
                micro_batch=micro_batch,
                seq_len=seq_len,
                lr=lr,
                data=data and str(data),
                loss_chunk_tokens=loss_chunk_tokens,
            ),
            dict(
                device=device,
                device_budget=_size(device_budget, "device_budget"),
                host_budget=_size(host_budget, "host_budget"),
                nvme_path=nvme_path and str(nvme_path),
                nvme_budget=_size(nvme_budget, "nvme_budget"),
                activations=activations,
                prefetch_depth=prefetch_depth,
                grad_accumulation=grad_accumulation,
                max_grad_norm=max_grad_norm,
            ),
        )
        result = _run(cfg, json_out)
    except CarinaError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    if json_out:
        from carina.core.progress import emit_json

        emit_json({"config": cfg.to_dict(), "result": result})
    else:
        _show(cfg, result)


def disagg_config(params: dict[str, Any], environ: Any = None) -> Any:
    """The :class:`~carina.offload.disagg.DisaggConfig` of ``carina train --disagg``'s options.

    Args:
        params: The parsed options (``workers``, ``ps_shards``, ``hosts``, ``node_rank``, ``rdzv``,
            ``device``, ``lr``).
        environ: The environment ``--rdzv env://`` reads (default: this process's).

    Raises:
        ConfigError: Bad multi-host options (see :func:`carina.offload.disagg.hosts.resolve`), or
            ``--workers`` that disagrees with the hostfile's slots.
    """
    import os

    from carina.core.errors import ConfigError
    from carina.offload.disagg import DisaggConfig
    from carina.offload.disagg.hosts import resolve

    place = resolve(
        hostfile=params.get("hosts"),
        node_rank=params.get("node_rank"),
        rdzv=params.get("rdzv"),
        environ=os.environ if environ is None else environ,
    )
    workers = params.get("workers")
    if place is not None and place.slots is not None and workers is not None and workers != place.slots:
        raise ConfigError(
            f"--workers {workers} but {params['hosts']} gives this host slots={place.slots}", key="workers"
        )
    cfg = DisaggConfig(
        workers=workers or 2, ps_shards=params["ps_shards"], device=params.get("device") or "auto",
        lr=params.get("lr") or 1e-3,
    )  # fmt: skip
    return cfg if place is None else place.apply(cfg)


def _run_disagg(params: dict[str, Any], steps: int, json_out: bool) -> None:
    """The disaggregated demo: a tiny Llama trained by ``workers`` processes through ``ps_shards`` PS shards.

    Without checkpoints. ``carina train`` (:mod:`carina.cli.train`, the CLI floor) adds
    ``--ckpt-dir``/``--ckpt-every`` by composing carina.offload.disagg with carina.ckpt there;
    carina.offload imports neither carina.ckpt nor carina.cli. With ``--hosts``/``--rdzv`` this
    process is one host's launcher of a multi-host job.
    """
    import time

    from carina.core.errors import CarinaError
    from carina.offload.disagg import launch

    try:
        cfg = disagg_config(params)
        start = time.perf_counter()
        result = launch(cfg, steps=steps)
    except CarinaError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    show_disagg(cfg, result, seconds=time.perf_counter() - start, json_out=json_out)


def show_disagg(
    cfg: Any, result: Any, *, seconds: float, json_out: bool, start_step: int = 0, saved: list[int] | None = None
) -> None:
    """Report a disaggregated run (JSON or one line); ``result`` is a LaunchResult or None (nothing left to run).

    Args:
        cfg: The run's :class:`~carina.offload.disagg.DisaggConfig`.
        result: What :func:`~carina.offload.disagg.launch` returned, or None.
        seconds: Wall time of the run.
        json_out: Print JSON instead of a line.
        start_step: The step the run resumed at (0: a fresh run).
        saved: Steps checkpointed by the caller.
    """
    from carina.core.progress import console, emit_json

    losses = result.losses if result is not None else []
    if json_out:
        emit_json(
            {
                "config": cfg.to_dict(),
                "start_step": start_step,
                "losses": losses,
                "steps": result.steps_done if result is not None else start_step,
                "checkpoints": saved or [],
                "seconds": seconds,
            }
        )
        return
    resumed = f" (resumed at step {start_step})" if start_step else ""
    done = result.steps_done if result is not None else start_step
    share = f"host {cfg.host_rank}'s share of the " if cfg.hosts > 1 else ""
    trend = f"; {share}loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "; nothing left to train"
    where = f" on host {cfg.host_rank} of {cfg.hosts}" if cfg.hosts > 1 else ""
    console().print(
        f"[bold]disagg[/] {cfg.workers} workers, {cfg.ps_shards} PS shards{where}, to step {done}{resumed} in "
        f"{seconds:.1f} s"
        f"{trend}; checkpoints {saved or 'none'}"
    )


def _run(cfg: Any, quiet: bool) -> Any:
    from carina.core.progress import progress
    from carina.offload.job import run

    with progress(transient=quiet) as bar:
        task = bar.add_task("training", total=cfg.steps)

        def on_step(rep: Any) -> None:
            tps = rep.tokens / max(rep.seconds, 1e-9)
            bar.update(task, advance=1, description=f"step {rep.step + 1} loss {rep.loss:.3f} {tps:,.0f} tok/s")

        return run(cfg, on_step)


def _show(cfg: Any, r: Any) -> None:
    from carina.core.progress import console, print_table
    from carina.memory.tiers import format_bytes

    out = console()
    budget = r.memory["device"]["budget"]
    ratio = f" = {r.model_bytes / budget:.1f}x the {format_bytes(budget)} device budget" if budget else ""
    out.print(
        f"[bold]model[/] {cfg.model}: {r.params / 1e6:.1f}M parameters, weights {format_bytes(r.model_bytes)}"
        f"{ratio}; device {r.device}"
    )
    if r.plan:
        b, t = r.plan["blocks"], r.plan["predicted_s"]
        out.print(
            f"[bold]plan[/] {b['streamed']} blocks streamed, {b['resident']} resident; activations keep "
            f"{b['keep']} / swap {b['swap']} / recompute {b['recompute']}; optimizer state on NVMe "
            f"{b['state_on_nvme']}; predicted step {t['step']:.3f}s (bottleneck {r.plan['bottleneck']})"
        )
    rows = [
        {
            "tier": t,
            "peak": format_bytes(m["peak"] or 0),
            "budget": "unlimited" if m["budget"] is None else format_bytes(m["budget"]),
        }
        for t, m in r.memory.items()
    ]
    print_table(rows, columns=["tier", "peak", "budget"], title="memory per tier")
    moved = ", ".join(f"{k} {format_bytes(v)}" for k, v in r.moved_per_step.items()) or "none"
    out.print(
        f"[bold]speed[/] {r.tokens_per_s:,.0f} tokens/s, {r.step_s:.3f} s/step after profiling; moved per step: {moved}"
    )
    verdict = "[green]yes[/]" if r.within_budget else "[red]NO[/]"
    how = f" (chunked, {r.loss_chunk_tokens} tokens per chunk)" if r.loss_chunk_tokens else ""
    out.print(f"[bold]loss[/]{how} {r.losses[0]:.3f} -> {r.losses[-1]:.3f}; memory stayed within budget: {verdict}")
