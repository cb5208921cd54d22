"""carina.offload.disagg: disaggregated sharded data parallel (DisDP).

GPUs only compute. Gradients leave each worker by device-to-host copies into shared host
memory (no collective kernels on the GPU); parameter-server (PS) processes, each owning a
shard of the parameters, reduce them on the CPU in a fixed worker order, run their optimizer
shard on fp32 master weights, and publish updated parameters that workers copy back to the
device. One host's PS serves every local worker; across hosts, PS shards exchange through
torch.distributed (gloo).

    from carina.offload.disagg import DisaggConfig, launch
    result = launch(DisaggConfig(workers=4, ps_shards=2), model_fn=..., data_fn=..., steps=10)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carina.offload.disagg.config import DisaggConfig
    from carina.offload.disagg.job import LaunchResult, launch

__all__ = ["DisaggConfig", "LaunchResult", "launch"]

_LAZY = {
    "DisaggConfig": ("carina.offload.disagg.config", "DisaggConfig"),
    "LaunchResult": ("carina.offload.disagg.job", "LaunchResult"),
    "launch": ("carina.offload.disagg.job", "launch"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(name)
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
