"""The PS state as a tree of tensors: what a checkpoint saves and a restore writes back.

Everything a PS shard keeps between steps lives in the shared segment: the fp32 masters and,
for AdamW, each parameter's step count and two moments. :func:`ps_state` returns views of
them (copy before the shards move on); :func:`load_ps_state` writes a saved tree back and
republishes the parameters. carina.offload must not import carina.ckpt, so the caller (the
training CLI) hands these trees to ``carina.ckpt`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carina.core.errors import CheckpointError
from carina.offload.disagg.layout import ParamSlot, SharedLayout, view

__all__ = ["MOMENTS", "load_ps_state", "ps_state", "state_views"]

#: Names of AdamW's per-parameter state in the segment, in layout order.
MOMENTS = ("step", "exp_avg", "exp_avg_sq")


def state_views(segment: Any, slot: ParamSlot) -> dict[str, Any]:
    """The optimizer-state tensors of ``slot`` (empty when the optimizer keeps none)."""
    import torch

    if not slot.state:
        return {}
    shapes = [(), slot.shape, slot.shape]
    return {
        name: view(segment, offset, shape, torch.float32)
        for name, offset, shape in zip(MOMENTS, slot.state, shapes, strict=True)
    }


def ps_state(layout: SharedLayout, segment: Any) -> dict[str, Any]:
    """``{"masters": {name: fp32}, "optimizer": {name: {step, exp_avg, exp_avg_sq}}}`` as views."""
    import torch

    return {
        "masters": {s.name: view(segment, s.master, s.shape, torch.float32) for s in layout.slots},
        "optimizer": {s.name: state_views(segment, s) for s in layout.slots if s.state},
    }


def load_ps_state(layout: SharedLayout, segment: Any, state: Mapping[str, Any], publish_dtype: Any) -> None:
    """Write a tree from :func:`ps_state` into the segment and republish every parameter.

    Raises:
        CheckpointError: The tree lacks a parameter or a moment, or a shape differs.
    """
    import torch

    masters, optimizer = state.get("masters", {}), state.get("optimizer", {})
    with torch.no_grad():
        for slot in layout.slots:
            saved = masters.get(slot.name)
            master = view(segment, slot.master, slot.shape, torch.float32)
            _copy_checked(master, saved, f"masters/{slot.name}")
            for name, dst in state_views(segment, slot).items():
                _copy_checked(dst, optimizer.get(slot.name, {}).get(name), f"optimizer/{slot.name}/{name}")
            view(segment, slot.published, slot.shape, publish_dtype).copy_(master)


def _copy_checked(dst: Any, src: Any, key: str) -> None:
    if src is None:
        raise CheckpointError("the checkpoint lacks PS state", key=key)
    if tuple(src.shape) != tuple(dst.shape):
        raise CheckpointError(f"PS state shape {tuple(src.shape)} != {tuple(dst.shape)}", key=key)
    dst.copy_(src)
