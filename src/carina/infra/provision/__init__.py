"""Bare-metal provisioning from network boot drives (M2 style).

Golden image -> copy-on-write clone per node -> NBD or iSCSI export -> per-MAC iPXE
script -> the node boots from its network disk. See ``docs/infra.provision.md``.

Importing this package is cheap; SQLAlchemy, FastAPI and qemu.qmp load on use::

    from carina.infra.provision import ExportKind, ProvisionConfig, Provisioner
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carina.infra.provision.config import ExportKind, IscsiBacking, NodeState, ProvisionConfig
    from carina.infra.provision.errors import Conflict, NotFound
    from carina.infra.provision.service import Placement, Provisioner

__all__ = [
    "Conflict",
    "ExportKind",
    "IscsiBacking",
    "NodeState",
    "NotFound",
    "Placement",
    "ProvisionConfig",
    "Provisioner",
]

_WHERE = {
    "ExportKind": "config",
    "IscsiBacking": "config",
    "NodeState": "config",
    "ProvisionConfig": "config",
    "Conflict": "errors",
    "NotFound": "errors",
    "Placement": "service",
    "Provisioner": "service",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'carina.infra.provision' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"carina.infra.provision.{_WHERE[name]}"), name)
