"""A storage middle tier with offloaded compression (SmartDS-style), spoken to over NBD.

Clients (qemu, nbdcopy, libnbd, the kernel) speak NBD to the tier; the tier
parses each request header on the CPU, hands the payload as a buffer view to a
payload engine (worker processes or torch on a GPU) that compresses on write and
decompresses on read, and keeps compressed blocks in a crash-consistent log with
a block map::

    from carina.infra.storage import TierConfig, StoreConfig, run
    run(TierConfig(store=StoreConfig(path="store", size=1 << 30)))   # nbd://127.0.0.1:10809/carina

Names are imported on first use, so ``import carina.infra.storage`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BlockStore",
    "CodecName",
    "EngineConfig",
    "EngineKind",
    "NbdServer",
    "ServerConfig",
    "StoreConfig",
    "Tier",
    "TierConfig",
    "run",
    "serve",
]

_WHERE = {
    "BlockStore": "store",
    "CodecName": "config",
    "EngineConfig": "config",
    "EngineKind": "config",
    "NbdServer": "listener",
    "ServerConfig": "config",
    "StoreConfig": "config",
    "Tier": "tier",
    "TierConfig": "config",
    "run": "service",
    "serve": "service",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
