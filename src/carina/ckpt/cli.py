"""``carina ckpt``: list, verify, inspect and prune checkpoint directories or fsspec URLs (no torch needed)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from carina.core.errors import CheckpointError

app = typer.Typer(
    help="Checkpoint-restart: list, verify, inspect, prune, bench.", no_args_is_help=True, add_completion=False
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DirArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint directory (holds step_N/ and latest), or an fsspec URL (s3://bucket/prefix; "
        "credentials and endpoint from the AWS_* environment)."
    ),
]
StepOpt = Annotated[int | None, typer.Option("--step", help="One checkpoint (default: all / newest).")]


def _remote(location: str) -> Any:
    """A :class:`~carina.ckpt.remote.RemoteStore` when ``location`` is a URL, else None."""
    from carina.ckpt.remote import RemoteStore, is_url

    return RemoteStore(location) if is_url(location) else None


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

    store = _remote(directory)
    if store is not None:
        infos, hint = store.list(), store.latest_hint()
    else:
        infos, hint = list_checkpoints(_checkpoint_dir(directory)), latest_hint(directory)
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

    store = _remote(directory)
    if step is not None:
        steps = [step]
    else:
        steps = store.committed_steps() if store is not None else committed_steps(_checkpoint_dir(directory))
    if not steps:
        raise CheckpointError("no committed checkpoint", path=directory)
    rows = []
    with progress(transient=True) as bar:
        task = bar.add_task("verifying", total=len(steps))
        for s in steps:
            try:
                local = os.path.join(directory, step_dir_name(s))
                m = store.verify(s) if store is not None else storage.verify(local)
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

    store = _remote(directory)
    if step is None:
        if store is not None:
            step, steps = store.latest_hint(), store.committed_steps()
        else:
            step, steps = storage.latest_hint(_checkpoint_dir(directory)), committed_steps(directory)
        if step is None:
            if not steps:
                raise CheckpointError("no committed checkpoint", path=directory)
            step = steps[-1]
    if store is not None:
        m = store.read_manifest(step)
    else:
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
    from carina.ckpt.commit import step_dir_name
    from carina.core.progress import emit_json

    store = _remote(directory)
    if store is not None:
        removed = [step_dir_name(s) for s in store.prune(keep)]
    else:
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
    table = [{**r, "blocking_s": f"{r['blocking_s']:.4f}", "durable_s": f"{r['durable_s']:.3f}",
              "done_s": f"{r['done_s']:.3f}"} for r in rows]  # fmt: skip
    columns = ["method", "size_mb", "blocking_s", "durable_s", "done_s"]
    print_table(table, columns=columns, title="save stall (no training)")
