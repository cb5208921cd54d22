"""``carina train`` with checkpoints: carina.offload's trainer composed with carina.ckpt.

This module owns ``carina train``: it is carina.offload's ``train`` command
(:mod:`carina.offload.train_cli`, which never imports carina.ckpt or carina.cli:
workloads do not import each other and point down floors only) plus the
checkpoint options, composed here on the CLI floor:

    carina train --model tiny --steps 100 --ckpt-every 25 --ckpt-dir ckpts
    carina train --model tiny --steps 100 --ckpt-every 25 --ckpt-dir ckpts --resume

Without them the command is offload's, untouched. With them,
:func:`carina.offload.job.run` runs with its ``resume``/``after_step`` hooks bound to a
:class:`carina.ckpt.Checkpointer` saving model masters, optimizer state, RNG
states and the data position every K steps; ``--resume`` restores the newest
verified checkpoint and fast-forwards the token stream, so a killed and resumed
run gives bitwise the losses of an uninterrupted one. With ``--disagg``, the
parameter-server state is checkpointed instead (:mod:`carina.cli.train_disagg`):

    carina train --disagg --workers 2 --steps 10 --device cpu --ckpt-dir ck --ckpt-every 2

Several hosts run one launcher each, placed by a hostfile or torch.distributed's ``env://``
variables (:mod:`carina.offload.disagg.hosts`); each checkpoints its own copy of the PS state:

    carina train --disagg --hosts hosts --node-rank 1 --ps-shards 4 --steps 100
    MASTER_ADDR=10.0.0.1 MASTER_PORT=29650 WORLD_SIZE=2 RANK=1 carina train --disagg --rdzv env:// --workers 8
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["CkptOptions", "app", "run_checkpointed"]

#: Test hook: SIGKILL this process right after the given step (a crash mid-run, mid-save), once the
#: save before the latest is committed (the latest may still be in flight).
KILL_ENV = "CARINA_TRAIN_KILL_AFTER_STEP"


@dataclass(frozen=True)
class CkptOptions:
    """The checkpoint options of ``carina train``."""

    every: int
    dir: str
    resume: bool
    writer: str = "thread"
    keep_last: int = 2


def run_checkpointed(
    cfg: Any, opts: CkptOptions, on_step: Callable[[Any], None] | None = None
) -> tuple[Any, dict[str, Any]]:
    """:func:`carina.offload.job.run`'s loop with a checkpoint every ``opts.every`` steps.

    Returns:
        The offload ``TrainResult`` (losses of the steps this process ran) and a
        summary: the step resumed from and the steps saved.
    """
    from carina.ckpt import Checkpointer, Config, WriterKind
    from carina.offload.job import run

    accum = cfg.offload.grad_accumulation
    kill_after = int(os.environ.get(KILL_ENV, "-1"))
    state: dict[str, Any] = {}
    saved: list[int] = []
    start = 0
    ck_cfg = Config(dir=opts.dir, keep_last=opts.keep_last, writer=WriterKind(opts.writer), every_steps=opts.every)
    with Checkpointer(ck_cfg) as ckpt:

        def resume(model: Any, optimizer: Any) -> int:
            nonlocal start
            state.update(model=model, optim=optimizer, data={"micro_batches": 0})
            if opts.resume and ckpt.list():
                start = ckpt.restore(state)
            return start

        def after_step(done: int) -> None:
            state["data"] = {"micro_batches": done * accum}
            if ckpt.maybe_save(done, state) is not None:
                saved.append(done)
            if done == kill_after:
                _await_older_commit(ckpt, done - opts.every)
                os.kill(os.getpid(), signal.SIGKILL)

        result = run(cfg, on_step, resume=resume, after_step=after_step)
        ckpt.wait()
    return result, {"resumed_from": start, "saved": saved, "dir": opts.dir}


def _await_older_commit(ckpt: Any, step: int, timeout_s: float = 60.0) -> None:
    """Test hook: before the kill, wait until a checkpoint at or before ``step`` is committed.

    The latest save may still be in flight when the kill lands; the one before it has had time
    on a quiet machine but not always on a loaded one, and a test of resuming needs something to
    resume from.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while step > 0 and not any(c.step <= step for c in ckpt.list()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _build(params: dict[str, Any]) -> Any:
    """Offload's TrainConfig from the command's parsed options (as offload's command builds it)."""
    from carina.offload.train_cli import _build_config, _size

    return _build_config(
        params["demo"],
        params["config"],
        {
            "model": params["model"],
            "steps": params["steps"],
            "micro_batch": params["micro_batch"],
            "seq_len": params["seq_len"],
            "lr": params["lr"],
            "data": params["data"] and str(params["data"]),
        },
        {
            "device": params["device"],
            "device_budget": _size(params["device_budget"], "device_budget"),
            "host_budget": _size(params["host_budget"], "host_budget"),
            "nvme_path": params["nvme_path"] and str(params["nvme_path"]),
            "nvme_budget": _size(params["nvme_budget"], "nvme_budget"),
            "activations": params["activations"],
            "prefetch_depth": params["prefetch_depth"],
            "grad_accumulation": params["grad_accumulation"],
            "max_grad_norm": params["max_grad_norm"],
        },
    )


def _checkpointed(params: dict[str, Any], opts: CkptOptions) -> None:
    from carina.core.errors import CarinaError
    from carina.core.progress import console, emit_json
    from carina.offload.train_cli import _show

    try:
        cfg = _build(params)
        result, summary = run_checkpointed(cfg, opts)
    except CarinaError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    if params["json_out"]:
        emit_json({"config": cfg.to_dict(), "result": result, "ckpt": summary})
        return
    _show(cfg, result)
    console().print(
        f"[bold]checkpoints[/] every {opts.every} steps in {opts.dir}; resumed from step "
        f"{summary['resumed_from']}; saved {summary['saved'] or 'none'}"
    )


def _command() -> typer.Typer:
    """A Typer app whose ``train`` takes offload's options plus the checkpoint ones."""
    import inspect
    import typing

    from carina.offload.train_cli import train as offload_train

    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
        for name, default, hint in (
            ("ckpt_every", 0, Annotated[int, typer.Option(help="Checkpoint every K steps (0: never).")]),
            ("ckpt_dir", None, Annotated[Path | None, typer.Option(
                help="Checkpoint directory (default ./ckpts); with --disagg: the PS state, resumed if present.")]),
            ("resume", False, Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint.")]),
            ("ckpt_writer", "thread", Annotated[str, typer.Option(help="thread, fork, process or sync.")]),
        )
    ]  # fmt: skip

    def train(**params: Any) -> None:
        every, ckpt_dir = params.pop("ckpt_every"), params.pop("ckpt_dir")
        resume, writer = params.pop("resume"), params.pop("ckpt_writer")
        if params["disagg"] and (every or resume or ckpt_dir is not None):
            from carina.cli.train_disagg import run_cli

            run_cli(params, ckpt_dir=Path(ckpt_dir or "ckpts"), every=every)
            return
        if not every and not resume:
            offload_train(**params)
            return
        if every < 0:
            raise typer.BadParameter("must be >= 0", param_hint="--ckpt-every")
        _checkpointed(params, CkptOptions(every=every, dir=str(ckpt_dir or "ckpts"), resume=resume, writer=writer))

    sig = inspect.signature(offload_train, eval_str=True)
    train.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])  # type: ignore[attr-defined]
    hints = typing.get_type_hints(offload_train, include_extras=True)
    train.__annotations__ = {**hints, **{p.name: p.annotation for p in extra}}
    train.__doc__ = (offload_train.__doc__ or "") + " With --ckpt-every/--resume: checkpoints through carina.ckpt."
    out = typer.Typer(help="Train a model larger than GPU memory (the main job).", add_completion=False)
    out.command()(train)
    return out


app = _command()
