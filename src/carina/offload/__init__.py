"""carina.offload: train and fine-tune models far larger than device memory.

One verb, then the loop you already have::

    import carina.offload as co
    model, optimizer = co.wrap(model, co.Config(device_budget=24 << 30), optimizer=optimizer)
    for batch in data:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

For a causal LM whose logits would be large (many tokens per micro-batch times a large vocabulary),
``loss = co.chunked_lm_loss(model, input_ids, labels, chunk_tokens=4096)`` computes the same loss with
only one chunk's logits alive (``carina.offload.chunkloss``).

When the whole training state fits the device (``Config(micro_batch_tokens=...)`` sizes the
activations), nothing is offloaded: the model and the user's optimizer run on the device as plain
PyTorch would (``carina.offload.resident``).

Heavy modules (torch) are imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carina.offload.api import OffloadHandle, handle_of, wrap
    from carina.offload.chunkloss import chunked_lm_loss
    from carina.offload.config import (
        ActivationPolicy,
        AllocatorMode,
        ComputeDtype,
        CpuOptimizerImpl,
        OffloadConfig,
        OverlapMode,
        ResidentMode,
    )
    from carina.offload.hostmem import process_baseline
    from carina.offload.planner import Plan, PlanBudgets, PlanMode, make_plan
    from carina.offload.resident import ResidentOptimizer
    from carina.offload.session import OffloadOptimizer

    Config = OffloadConfig

__all__ = [
    "ActivationPolicy",
    "AllocatorMode",
    "ComputeDtype",
    "Config",
    "CpuOptimizerImpl",
    "OffloadConfig",
    "OffloadHandle",
    "OffloadOptimizer",
    "OverlapMode",
    "Plan",
    "PlanBudgets",
    "PlanMode",
    "ResidentMode",
    "ResidentOptimizer",
    "chunked_lm_loss",
    "handle_of",
    "make_plan",
    "process_baseline",
    "wrap",
]

_LAZY = {
    "wrap": ("carina.offload.api", "wrap"),
    "handle_of": ("carina.offload.api", "handle_of"),
    "OffloadHandle": ("carina.offload.api", "OffloadHandle"),
    "OffloadConfig": ("carina.offload.config", "OffloadConfig"),
    "Config": ("carina.offload.config", "OffloadConfig"),
    "ActivationPolicy": ("carina.offload.config", "ActivationPolicy"),
    "ComputeDtype": ("carina.offload.config", "ComputeDtype"),
    "AllocatorMode": ("carina.offload.config", "AllocatorMode"),
    "CpuOptimizerImpl": ("carina.offload.config", "CpuOptimizerImpl"),
    "OverlapMode": ("carina.offload.config", "OverlapMode"),
    "Plan": ("carina.offload.planner", "Plan"),
    "PlanBudgets": ("carina.offload.planner", "PlanBudgets"),
    "PlanMode": ("carina.offload.planner", "PlanMode"),
    "ResidentMode": ("carina.offload.config", "ResidentMode"),
    "ResidentOptimizer": ("carina.offload.resident", "ResidentOptimizer"),
    "make_plan": ("carina.offload.planner", "make_plan"),
    "process_baseline": ("carina.offload.hostmem", "process_baseline"),
    "chunked_lm_loss": ("carina.offload.chunkloss", "chunked_lm_loss"),
    "OffloadOptimizer": ("carina.offload.session", "OffloadOptimizer"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'carina.offload' has no attribute {name!r}")
