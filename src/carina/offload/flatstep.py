"""One fused optimizer step per block, over the block's flat buffers.

A block's float32 masters are views into one flat buffer, its gradients views into
another. PyTorch's fused CPU kernels (Adam, AdamW, SGD, Adagrad) run one parallel
region per parameter tensor, each split evenly over the thread team and ending when
its slowest thread does, so a decoder block's update is 9 such regions; where cores
are contended every region waits (``benchmarks/offload/bench_cpu_optimizer.py``).
:class:`FlatStep` keeps the block's optimizer state flat as well and steps the whole
block as one tensor. The per-parameter state that the user's optimizer holds (and
that ``state_dict()`` returns) becomes views into the flat state, so nothing outside
sees a difference: the kernels are elementwise, so each element's update is the
same as in the per-parameter step.

A block whose gradient arrived in the compute dtype (``ParamGroup.narrow``: one micro-batch, no
clipping) is stepped in chunks of :data:`UPCAST_CHUNK` elements instead: each chunk of the gradient
is upcast into a small float32 buffer that stays in the CPU caches and the same kernel steps the
masters' and state's views of that chunk. The upcast is exact, and the float32 gradient the other
path reads is the same upcast done on the device, so the bits are the same; host memory reads half
the gradient's bytes.
"""

from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from carina.offload.blocks import ParamGroup

__all__ = ["UPCAST_CHUNK", "FlatStep"]

#: Elements per chunk of a compute-dtype gradient's update: a 16 MiB float32 upcast buffer, about a
#: megabyte per thread of a 16-core team (within its L2), and a few hundred kernel calls for a 7B model.
UPCAST_CHUNK = 1 << 22

#: One upcast buffer per thread that steps, shared by every block (a block's update runs on one thread
#: from start to end): 16 MiB per thread, not per block (a FlatStep each would pin ~0.5 GiB at 7B).
_UPCAST = threading.local()


def _upcast_buffer(n: int) -> torch.Tensor:
    """This thread's float32 buffer of at least ``min(n, UPCAST_CHUNK)`` elements."""
    need = min(n, UPCAST_CHUNK)
    buf: torch.Tensor | None = getattr(_UPCAST, "buf", None)
    if buf is None or buf.numel() < need:
        buf = _UPCAST.buf = torch.empty(need, dtype=torch.float32)
    return buf


class FlatStep:
    """A private optimizer of the user's class over one block's flat master buffer.

    Args:
        inner: The optimizer over the masters (its class, the block's param group).
        group: The block.
        options: The block's param group in ``inner`` (hyperparameters are read from it
            at every step, so LR schedulers apply).
    """

    def __init__(self, inner: torch.optim.Optimizer, group: ParamGroup, options: dict[str, Any]) -> None:
        self.inner, self.group, self.options = inner, group, options
        self.param = nn.Parameter(group.master, requires_grad=True)
        accepted = inspect.signature(type(inner).__init__).parameters
        kwargs = {k: v for k, v in options.items() if k != "params" and k in accepted}
        self.opt = type(inner)([self.param], **kwargs)
        self.chunk = nn.Parameter(torch.empty(0), requires_grad=True)
        self.chunk_opt = type(inner)([self.chunk], **kwargs)
        self._adopt()

    @classmethod
    def for_group(cls, inner: torch.optim.Optimizer, group: ParamGroup) -> FlatStep | None:
        """A FlatStep for ``group`` when it applies: a fused optimizer, one param group, uniform state."""
        ids = {id(mp) for mp in group.masters}
        owners = [g for g in inner.param_groups if ids & {id(p) for p in g["params"]}]
        if len(owners) != 1 or not owners[0].get("fused") or len(group.masters) < 2:
            return None
        if not ids <= {id(p) for p in owners[0]["params"]}:
            return None
        states = [inner.state.get(mp, {}) for mp in group.masters]
        if any(states) and not all(s.keys() == states[0].keys() for s in states):
            return None
        return cls(inner, group, owners[0])

    def _adopt(self) -> None:
        """Start the flat state from the per-parameter state, if the parameters have any."""
        g = self.group
        states = [self.inner.state.get(mp, {}) for mp in g.masters]
        if not states[0]:
            return
        flat: dict[str, Any] = {}
        for key, first in states[0].items():
            per_element = key != "step" and all(
                isinstance(s[key], torch.Tensor) and s[key].numel() == mp.numel()
                for s, mp in zip(states, g.masters, strict=True)
            )
            if per_element:
                flat[key] = torch.cat([s[key].reshape(-1) for s in states])
            else:
                flat[key] = first.clone() if isinstance(first, torch.Tensor) else first
        self.opt.state[self.param] = flat
        self._link()

    def _link(self) -> None:
        """Make the per-parameter state views into the flat state (the step count is shared)."""
        g = self.group
        flat = self.opt.state[self.param]
        for i, mp in enumerate(g.masters):
            sl = g.slot(i)
            self.inner.state[mp] = {
                key: (t[sl].view(mp.shape) if key != "step" and isinstance(t, torch.Tensor) else t)
                for key, t in flat.items()
            }

    def hyperparameters(self) -> dict[str, Any]:
        """A copy of the block's hyperparameters now (tensors cloned), for an update that runs later."""
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.options.items() if k != "params"}

    @property
    def ready(self) -> bool:
        """Whether the flat state exists (after the first update): a compute-dtype gradient can be stepped."""
        return bool(self.opt.state.get(self.param))

    def step(self, options: dict[str, Any] | None = None) -> None:
        """Update the block's masters from its flat gradient (with ``options``, those hyperparameters).

        The gradient is the float32 host gradient, or with ``group.narrow`` the compute-dtype one
        (:attr:`ParamGroup.narrow_grad`), stepped chunk by chunk.
        """
        for pg in (self.opt.param_groups[0], self.chunk_opt.param_groups[0]):
            for key, value in (self.options if options is None else options).items():
                if key != "params":
                    pg[key] = value
        if self.group.narrow and self.ready:
            self._step_chunks(self.group.narrow_grad)
            return
        self.group.widen_grad(UPCAST_CHUNK)  # (narrow but no flat state to step in chunks: float32 again)
        first = not self.opt.state.get(self.param)
        self.param.grad = self.group.grad
        try:
            self.opt.step()
        finally:
            self.param.grad = None
        if first:
            self._link()

    def _step_chunks(self, grad: torch.Tensor) -> None:
        """One update from ``grad`` (compute dtype), chunk by chunk through a float32 buffer.

        Each chunk is a parameter of its own for the kernel: the masters' and the state's views of
        the chunk, the step count as it was before this update (the kernel advances it once per
        chunk, each from the same count). Afterwards the shared count is the advanced one.
        """
        flat = self.opt.state[self.param]
        n = self.group.numel
        per_element = {k for k, t in flat.items() if isinstance(t, torch.Tensor) and t.numel() == n and k != "step"}
        before = {k: t.clone() if isinstance(t, torch.Tensor) else t for k, t in flat.items() if k not in per_element}
        upcast = _upcast_buffer(n)
        state: dict[str, Any] = {}
        for start in range(0, n, UPCAST_CHUNK):
            stop = min(n, start + UPCAST_CHUNK)
            state = {k: flat[k][start:stop] for k in per_element}
            state.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in before.items()})
            self.chunk.data = self.group.master[start:stop]
            self.chunk_opt.state[self.chunk] = state
            wide = upcast[: stop - start]
            wide.copy_(grad[start:stop])
            self.chunk.grad = wide
            try:
                self.chunk_opt.step()
            finally:
                self.chunk.grad = None
        for k in before:  # the count the kernel advanced (every chunk's is the same)
            if isinstance(flat[k], torch.Tensor):
                flat[k].copy_(state[k])
            else:
                flat[k] = state[k]
        self.chunk_opt.state.pop(self.chunk, None)
        self.chunk.data = torch.empty(0)
