"""The ``carina`` root command: ``doctor``, ``version`` and the lazy sub-apps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from carina.cli.lazy import LazyGroup

app = typer.Typer(
    name="carina",
    cls=LazyGroup,
    help="Build and run AI training infrastructure on commodity parts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@app.command()
def version(json_out: JsonOpt = False) -> None:
    """Print carina's version."""
    from carina import __version__

    if json_out:
        from carina.core.progress import emit_json

        emit_json({"carina": __version__})
    else:
        typer.echo(f"carina {__version__}")


@app.command()
def doctor(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="Storage paths to check (default: current directory).")
    ] = None,
    json_out: JsonOpt = False,
    no_tools: Annotated[bool, typer.Option("--no-tools", help="Skip looking for system tools.")] = False,
) -> None:
    """Report Python, torch/CUDA/GPUs, pinned memory, O_DIRECT, io_uring, tools and extras."""
    from carina.cli.doctor_view import show
    from carina.core.doctor import collect

    report = collect(paths or [Path()], tools=not no_tools)
    show(report, json_out=json_out, io=_io_choice())


def _io_choice() -> dict[str, object]:
    """Which carina.io backend ``auto`` picks here, and why it skipped the others; the batched-gather path too."""
    from carina.core.errors import BackendUnavailable
    from carina.io._rows import gather_path_report
    from carina.io.backends import choose_backend

    gathers = gather_path_report()
    try:
        selection = choose_backend("auto")
    except BackendUnavailable as exc:
        return {"backend": None, "reason": str(exc), "gather_path": gathers}
    return {"backend": selection.backend.name, "skipped": selection.skipped, "gather_path": gathers}


def main() -> None:
    """Console-script entry point; turns carina errors into one clear line."""
    from carina.core.errors import CarinaError

    try:
        app()
    except CarinaError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise SystemExit(2) from None
