"""``carina ckpt``: list, verify, inspect and prune checkpoint directories (no torch needed)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from carina.core.errors import CheckpointError

app = typer.Typer(
    help="Checkpoint-restart: list, verify, inspect, prune, bench.", no_args_is_help=True, add_completion=False
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DirArg = Annotated[str, typer.Argument(help="Checkpoint directory (holds step_N/ and latest).")]
StepOpt = Annotated[int | None, typer.Option("--step", help="One checkpoint (default: all / newest).")]


def _checkpoint_dir(directory: str) -> str:
    """``directory`` if it exists; a typo must not read as "no checkpoints"."""
    if not os.path.isdir(directory):
        raise CheckpointError("not a checkpoint directory", path=directory)
    return directory


@app.command("ls")
def ls(directory: DirArg, json_out: JsonOpt = False) -> None:
    """List committed checkpoints, oldest first; * marks the one `latest` names."""
    from carina.ckpt.storage import latest_hint, list_checkpoints
    from carina.core.progress import emit_json, print_table

    infos = list_checkpoints(_checkpoint_dir(directory))
    hint = latest_hint(directory)
    rows = [
        {
            "step": i.step,
            "latest": i.step == hint,
            "bytes": i.nbytes,
            "world_size": i.world_size,
            "tensors": i.tensors,
            "path": i.path,
            "error": i.error,
        }
        for i in infos
    ]
    if json_out:
        emit_json(rows)
        return
    table = [{**r, "step": f"{r['step']}{' *' if r['latest'] else ''}"} for r in rows]
    print_table(table, columns=["step", "bytes", "world_size", "tensors", "error"], title=directory)


@app.command()
def verify(directory: DirArg, step: StepOpt = None, json_out: JsonOpt = False) -> None:
    """Check every checksum of every (or one) checkpoint; exit 1 if any is corrupt."""
    from carina.ckpt import storage
    from carina.ckpt.commit import committed_steps, step_dir_name
    from carina.core.progress import emit_json, print_table, progress

    steps = [step] if step is not None else committed_steps(_checkpoint_dir(directory))
    if not steps:
        raise CheckpointError("no committed checkpoint", path=directory)
    rows = []
    with progress(transient=True) as bar:
        task = bar.add_task("verifying", total=len(steps))
        for s in steps:
            try:
                m = storage.verify(os.path.join(directory, step_dir_name(s)))
                rows.append({"step": s, "ok": True, "bytes": m.nbytes, "error": ""})
            except CheckpointError as exc:
                rows.append({"step": s, "ok": False, "bytes": 0, "error": str(exc)})
            bar.advance(task)
    if json_out:
        emit_json(rows)
    else:
        print_table(rows, columns=["step", "ok", "bytes", "error"], title=f"verify {directory}")
    if not all(r["ok"] for r in rows):
        raise typer.Exit(1)


@app.command()
def inspect(directory: DirArg, step: StepOpt = None, json_out: JsonOpt = False) -> None:
    """Show a checkpoint's tensors (name, dtype, shape, bytes, crc32) per rank."""
    from carina.ckpt import storage
    from carina.ckpt.commit import committed_steps, step_dir_name
    from carina.core.progress import emit_json, print_table

    if step is None:
        step = storage.latest_hint(_checkpoint_dir(directory))
        if step is None:
            steps = committed_steps(directory)
            if not steps:
                raise CheckpointError("no committed checkpoint", path=directory)
            step = steps[-1]
    m = storage.read_manifest(os.path.join(directory, step_dir_name(step)))
    rows = [
        {"rank": s.rank, "name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes, "crc32": t.crc32,
         "piece": "" if t.global_shape is None else f"at {list(t.global_offset or ())} of {list(t.global_shape)}"}
        for s in m.shards
        for t in s.tensors
    ]  # fmt: skip
    if json_out:
        emit_json({"step": m.step, "world_size": m.world_size, "bytes": m.nbytes, "tensors": rows})
        return
    pieces = ["piece"] if any(r["piece"] for r in rows) else []
    columns = ["rank", "name", "dtype", "shape", "bytes", "crc32", *pieces]
    print_table(rows, columns=columns, title=f"step {m.step}")


@app.command()
def prune(
    directory: DirArg,
    keep: Annotated[int, typer.Option("--keep", min=1, help="Newest checkpoints to keep.")] = 2,
    json_out: JsonOpt = False,
) -> None:
    """Delete all but the newest ``--keep`` committed checkpoints and leftover temp dirs."""
    from carina.ckpt.commit import prune as do_prune
    from carina.core.progress import emit_json

    removed = do_prune(_checkpoint_dir(directory), keep)
    if json_out:
        emit_json({"removed": removed})
    else:
        for name in removed:
            typer.echo(f"removed {name}")


@app.command()
def bench(
    size_mb: Annotated[int, typer.Option("--size-mb", min=1, help="Synthetic state size.")] = 256,
    reps: Annotated[int, typer.Option("--reps", min=1)] = 3,
    writers: Annotated[str, typer.Option("--writers", help="Comma-separated writers.")] = "thread,process,fork,sync",
    directory: Annotated[str | None, typer.Option("--dir", help="Disk to write to (default: temp dir).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Quick check: how long save() blocks and how long until durable, per writer vs torch.save."""
    from carina.ckpt.quickbench import quick_bench
    from carina.core.progress import emit_json, print_table

    rows = quick_bench(size_mb, reps, [w for w in writers.split(",") if w], directory)
    if json_out:
        emit_json(rows)
        return
    table = [{**r, "blocking_s": f"{r['blocking_s']:.4f}", "durable_s": f"{r['durable_s']:.3f}"} for r in rows]
    print_table(table, columns=["method", "size_mb", "blocking_s", "durable_s"], title="save stall (no training)")
