"""carina.ckpt: checkpoint-restart that barely stalls training (CRUM-style).

    from carina.ckpt import Checkpointer, Config
    ckpt = Checkpointer(Config(dir="ckpts", keep_last=2, writer="fork"))
    ckpt.save(step, {"model": model, "optim": opt})   # blocks only for the snapshot
    ckpt.wait()                                       # committed; background errors surface here
    step = ckpt.restore({"model": model, "optim": opt})

Importing this package imports no torch; the names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carina.ckpt.checkpointer import Checkpointer, SaveHandle
    from carina.ckpt.config import CheckpointConfig
    from carina.ckpt.config import CheckpointConfig as Config
    from carina.ckpt.manifest import Manifest, parse_manifest
    from carina.ckpt.storage import CheckpointInfo, list_checkpoints, verify
    from carina.ckpt.writers import WriterKind

__all__ = [
    "CheckpointConfig",
    "CheckpointInfo",
    "Checkpointer",
    "Config",
    "Manifest",
    "SaveHandle",
    "WriterKind",
    "list_checkpoints",
    "parse_manifest",
    "verify",
]

_LAZY = {
    "Checkpointer": ("carina.ckpt.checkpointer", "Checkpointer"),
    "SaveHandle": ("carina.ckpt.checkpointer", "SaveHandle"),
    "CheckpointConfig": ("carina.ckpt.config", "CheckpointConfig"),
    "Config": ("carina.ckpt.config", "CheckpointConfig"),
    "Manifest": ("carina.ckpt.manifest", "Manifest"),
    "parse_manifest": ("carina.ckpt.manifest", "parse_manifest"),
    "CheckpointInfo": ("carina.ckpt.storage", "CheckpointInfo"),
    "list_checkpoints": ("carina.ckpt.storage", "list_checkpoints"),
    "verify": ("carina.ckpt.storage", "verify"),
    "WriterKind": ("carina.ckpt.writers", "WriterKind"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'carina.ckpt' has no attribute {name!r}")
