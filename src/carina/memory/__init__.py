"""carina.memory: pinned host arenas, memory tiers and a budgeted TensorStore.

The floor that offload, gnn and ckpt share. Imports of torch happen lazily, so
``import carina.memory`` stays light::

    from carina.memory import HostArena
    arena = HostArena(64 << 20, pin="auto")   # pinned when CUDA is available
    t = arena.alloc(4096)                     # a uint8 CPU tensor view into the arena
    arena.used, arena.capacity
    arena.reset()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carina.memory.arena import HostArena, PinMode
    from carina.memory.mapped import device_view, mapped_view
    from carina.memory.store import StoreStats, TensorStore, TierBudgets
    from carina.memory.tiers import Tier

__all__ = ["HostArena", "PinMode", "StoreStats", "Tier", "TensorStore", "TierBudgets", "device_view", "mapped_view"]

_LAZY = {
    "HostArena": "carina.memory.arena",
    "PinMode": "carina.memory.arena",
    "Tier": "carina.memory.tiers",
    "TensorStore": "carina.memory.store",
    "TierBudgets": "carina.memory.store",
    "StoreStats": "carina.memory.store",
    "device_view": "carina.memory.mapped",
    "mapped_view": "carina.memory.mapped",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'carina.memory' has no attribute {name!r}")
