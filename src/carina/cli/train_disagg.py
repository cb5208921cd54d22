"""Checkpointed disaggregated training: carina.offload.disagg's PS state saved through carina.ckpt.

carina.offload (disagg included) must not import carina.ckpt, so the two meet here, on the CLI
floor, which may import both. :func:`run_disagg` restores the newest verified checkpoint (if
any), starts the job at that step, and saves the PS state every ``ckpt_every`` steps while
the shards hold at that step boundary; ``carina train --disagg --ckpt-dir D --ckpt-every K``
calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["DisaggRun", "run_cli", "run_disagg"]


@dataclass
class DisaggRun:
    """What a (possibly resumed) run did: the first step it ran, its result, the steps saved."""

    start_step: int
    result: Any  # carina.offload.disagg.LaunchResult, or None when the checkpoint was already final
    saved: list[int]


def run_disagg(
    cfg: Any, *, steps: int, ckpt_dir: Path | None = None, ckpt_every: int = 0, keep_last: int = 2, **launch_kw: Any
) -> DisaggRun:
    """Train to global step ``steps``; with ``ckpt_dir``, resume from and checkpoint into it.

    Args:
        cfg: A :class:`~carina.offload.disagg.DisaggConfig`.
        steps: The global step to stop at.
        ckpt_dir: Checkpoint directory (None: no checkpoints).
        ckpt_every: Save every this many steps (and at the end when it divides ``steps``).
        keep_last: Committed checkpoints kept.
        **launch_kw: Passed to :func:`~carina.offload.disagg.launch` (``model_fn``, ``batch_fn``, ...).

    Raises:
        ConfigError: ``ckpt_every`` without ``ckpt_dir``, or a negative interval.
        CheckpointError: The newest checkpoint does not match the model.
        WorkerDied: A worker died (saves committed before it stay; the next run resumes from them).
    """
    from carina.core.errors import ConfigError
    from carina.offload.disagg import launch

    if ckpt_every < 0 or (ckpt_every and ckpt_dir is None):
        raise ConfigError("--ckpt-every needs --ckpt-dir and a positive interval", key="ckpt_every")
    if ckpt_dir is None:
        return DisaggRun(0, launch(cfg, steps=steps, **launch_kw), [])
    from carina.ckpt import CheckpointConfig, Checkpointer

    saved: list[int] = []
    with Checkpointer(CheckpointConfig(dir=str(ckpt_dir), keep_last=keep_last)) as ckpt:
        start, state = 0, None
        if ckpt.list():
            box: dict[str, Any] = {"ps": {}, "meta": {}}
            start = ckpt.restore(box)
            state = box["ps"]
        if start >= steps:
            return DisaggRun(start, None, saved)

        def on_checkpoint(step: int, tree: dict[str, Any]) -> None:
            ckpt.save(step, {"ps": tree, "meta": {"step": step, "optimizer": cfg.optimizer, "lr": cfg.lr}})
            saved.append(step)  # the save copied the tensors: the shards may move on

        run_cfg = replace(cfg, checkpoint_every=ckpt_every)
        result = launch(run_cfg, steps=steps, start_step=start, state=state, on_checkpoint=on_checkpoint, **launch_kw)
        return DisaggRun(start, result, saved)


def run_cli(params: dict[str, Any], *, ckpt_dir: Path, every: int) -> None:
    """``carina train --disagg --ckpt-dir D [--ckpt-every K]``: run, checkpoint, report (exit 2 on errors).

    Args:
        params: The parsed options of offload's ``train`` command.
        ckpt_dir: Where the PS state is checkpointed (and resumed from).
        every: Save every this many steps (0: resume only).
    """
    import time

    import typer

    from carina.core.errors import CarinaError
    from carina.offload.train_cli import disagg_config, show_disagg

    try:
        cfg = disagg_config(params)  # with --hosts/--rdzv: this host's part (its own checkpoints)
        start = time.perf_counter()
        run = run_disagg(cfg, steps=params["steps"] or 5, ckpt_dir=ckpt_dir, ckpt_every=every)
    except CarinaError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    show_disagg(
        cfg,
        run.result,
        seconds=time.perf_counter() - start,
        json_out=params["json_out"],
        start_step=run.start_step,
        saved=run.saved,
    )
