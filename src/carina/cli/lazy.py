"""A click group that imports each subsystem's sub-app only when it is used.

``carina --help`` lists every sub-app from a static table (name, module, one-line
help) without importing anything heavy; ``carina io ...`` imports ``carina.io.cli``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.core import TyperGroup

__all__ = ["SUBCOMMANDS", "LazyGroup", "SubApp"]

_PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SubApp:
    """A lazily loaded sub-app: ``module`` holds a Typer ``app``."""

    name: str
    module: str
    help: str

    def present(self) -> bool:
        """Whether the module's file exists (checked without importing it)."""
        rel = Path(*self.module.split(".")[1:])
        return (_PACKAGE / rel).with_suffix(".py").is_file() or (_PACKAGE / rel / "__init__.py").is_file()


SUBCOMMANDS: tuple[SubApp, ...] = (
    SubApp("io", "carina.io.cli", "Asynchronous batched storage engine: probe, read, write, bench."),
    SubApp("train", "carina.cli.train", "Train a model larger than GPU memory (the main job)."),
    SubApp("offload", "carina.offload.cli", "Profile, plan and inspect offloaded training."),
    SubApp("gnn", "carina.gnn.cli", "Out-of-core GNN training, cost model and GPU placement."),
    SubApp("ckpt", "carina.ckpt.cli", "Checkpoint-restart: list, verify, inspect, prune, bench."),
    SubApp("cluster", "carina.infra.cluster.cli", "GPU node validation, collectives, scaling model."),
    SubApp("provision", "carina.infra.provision.cli", "Bare-metal provisioning from network boot drives."),
    SubApp("storage", "carina.infra.storage.cli", "Storage middle tier with offloaded compression."),
    SubApp("risk", "carina.security.risk.cli", "Layered-graph risk quantification of system stacks."),
    SubApp("introspect", "carina.security.introspect.cli", "Agentless scanning of disk images."),
    SubApp("tee", "carina.security.tee.cli", "Confidential-computing overhead: detect, measure, emulate."),
    SubApp("faults", "carina.security.faults.cli", "Timing-fault injection into DNN accelerators."),
)
_BY_NAME = {s.name: s for s in SUBCOMMANDS}


class LazyGroup(TyperGroup):
    """Typer's group plus the sub-apps of :data:`SUBCOMMANDS` that are present."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Typer's own commands, then the present lazy sub-apps."""
        eager = super().list_commands(ctx)
        lazy = [s.name for s in SUBCOMMANDS if s.present() and s.name not in eager]
        return eager + lazy

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``; a lazy sub-app is imported only when it will run."""
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            return cmd
        sub = _BY_NAME.get(cmd_name)
        if sub is None or not sub.present():
            return None
        if ctx.resilient_parsing or self._listing:
            return TyperGroup(name=sub.name, help=sub.help, short_help=sub.help)
        return _load(sub)

    _listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Draw help from the static table: names and help lines only, no imports."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def _load(sub: SubApp) -> Any:
    import typer.main

    module: Any = importlib.import_module(sub.module)
    cmd = typer.main.get_command(module.app)
    cmd.name = sub.name
    if not cmd.help:
        cmd.help = sub.help
    cmd.short_help = sub.help
    return cmd
