"""Saved-activation handling: keep, swap to host, or (with checkpointing) recompute.

While a wrapped model runs forward, a ``saved_tensors_hooks`` pair sees every
tensor autograd saves. Views of offloaded parameters are packed as references
(their storage is refilled before backward uses them); activations saved
inside a block are kept or swapped to host RAM per that block's action, and
the first unpack of a block in backward prefetches the parameters and the
swapped activations of the block below it. Blocks whose action is recompute
run under ``torch.utils.checkpoint`` and save nothing here.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from carina.memory.tiers import Tier
from carina.offload.hostmem import pinned_cache_bytes
from carina.offload.simulator import Action

if TYPE_CHECKING:
    from carina.memory.store import TensorStore
    from carina.offload.blocks import ParamGroup
    from carina.offload.streams import Mover

__all__ = ["ActivationManager", "ActivationRuntime"]

#: Tensors smaller than this are always kept (metadata, rotary tables).
SWAP_MIN_BYTES = 1024


@dataclass(eq=False)
class _ParamRef:
    group: ParamGroup
    tensor: torch.Tensor


@dataclass(eq=False)
class _Kept:
    block: int
    tensor: torch.Tensor


@dataclass(eq=False)
class _Swap:
    block: int
    host: torch.Tensor
    event: Any
    device: torch.Tensor | None = None
    fetched: Any = None


@dataclass
class _BlockActs:
    swaps: list[_Swap] = field(default_factory=list)
    seen: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    device_bytes: int = 0
    host_bytes: int = 0
    pinned_bytes: int = 0  # what the swapped tensors pin (PyTorch's pinned cache rounds each up)
    saved_bytes: int = 0


class ActivationRuntime(Protocol):
    """What the manager uses of its runtime (:class:`~carina.offload.runtime.OffloadRuntime`)."""

    device: torch.device
    store: TensorStore
    mover: Mover
    groups: list[ParamGroup]
    blocks: list[ParamGroup]
    actions: list[Action]
    storage_owner: dict[int, ParamGroup]
    current: int | None
    in_forward: bool
    profiling: bool

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A step-timer phase."""

    def enter_backward(self, i: int) -> None:
        """Backward has reached block ``i``."""


class ActivationManager:
    """Packs and unpacks saved tensors for one runtime."""

    def __init__(self, runtime: ActivationRuntime) -> None:
        self.rt = runtime
        self._ctx: Any = None
        self._blocks: dict[int, _BlockActs] = defaultdict(_BlockActs)
        self.other_bytes = 0
        self._other_seen: dict[tuple[Any, ...], torch.Tensor] = {}
        self.swap_allowance: int | None = None  # host bytes profiling may swap (None: no limit)
        self._measured: dict[tuple[Any, ...], int] = {}  # saved bytes per kind of block, while profiling
        self._pinned: dict[tuple[Any, ...], int] = {}  # pinned host bytes of its swap, per kind of block

    def _twin(self, block: int) -> tuple[Any, ...]:
        group = self.rt.blocks[block]
        return (type(group.module), tuple(tuple(p.shape) for p in group.params))

    def profile_action(self, block: int) -> None:
        """While profiling under swap, pick ``block``'s action: swap while the host allowance lasts.

        A block whose twin was measured and whose swap would overrun :attr:`swap_allowance`
        runs under recompute (nothing reaches host RAM) and takes the twin's activation bytes;
        a block of a kind not yet measured is always swapped, so every kind is measured once.
        """
        rt = self.rt
        seen = self._measured.get(self._twin(block))
        # pinned swaps cost what PyTorch's pinned allocator takes for them (powers of two), not their bytes
        live = sum(acts.pinned_bytes or acts.host_bytes for acts in self._blocks.values())
        cost = self._pinned.get(self._twin(block)) or seen
        if seen is None or cost is None or self.swap_allowance is None or live + cost <= self.swap_allowance:
            rt.actions[block] = Action.SWAP
            return
        rt.actions[block] = Action.RECOMPUTE
        group = rt.blocks[block]
        group.act_bytes = max(group.act_bytes, seen)
        group.swap_host_bytes = max(group.swap_host_bytes, self._pinned.get(self._twin(block), 0))

    def begin_forward(self) -> None:
        """Start intercepting saved tensors (called when the model's forward starts)."""
        self.other_bytes = 0
        self._other_seen.clear()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()

    def end_forward(self) -> None:
        """Stop intercepting (called when the model's forward returns or raises)."""
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None
        self._other_seen.clear()

    def _pack(self, t: torch.Tensor) -> Any:
        rt = self.rt
        owner = rt.storage_owner.get(t.untyped_storage().data_ptr())
        if owner is not None:
            return _ParamRef(owner, t)
        i = rt.current
        nbytes = t.numel() * t.element_size()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if i is None:
            if key not in self._other_seen:  # a tensor saved by several ops is counted once
                self._other_seen[key] = t
                self.other_bytes += nbytes
            return t
        acts = self._blocks[i]
        if key in acts.seen:
            return acts.seen[key][0]
        acts.saved_bytes += nbytes
        if rt.actions[i] is Action.SWAP and nbytes >= SWAP_MIN_BYTES:
            with rt.phase("act_offload"):
                host = rt.store.empty(tuple(t.shape), t.dtype, Tier.HOST, f"block {i} activation")
                packed: Any = _Swap(i, host, rt.mover.to_host(host, t))
            acts.host_bytes += nbytes
            acts.pinned_bytes += pinned_cache_bytes(nbytes) if rt.store.pinned else 0
            rt.store.note_move(Tier.DEVICE, Tier.HOST, nbytes)
            acts.swaps.append(packed)
        else:
            rt.store.charge(Tier.DEVICE, nbytes, f"block {i} activations")
            acts.device_bytes += nbytes
            packed = _Kept(i, t)
        acts.seen[key] = (packed, t)  # holds t, so its address is not reused while we dedupe by it
        return packed

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _ParamRef):
            self.rt.enter_backward(packed.group.index)
            return packed.tensor
        if isinstance(packed, _Kept):
            self.rt.enter_backward(packed.block)
            return packed.tensor
        if isinstance(packed, _Swap):
            self.rt.enter_backward(packed.block)
            with self.rt.phase("act_wait"):
                self._fetch(packed)
                self.rt.mover.wait_on_compute(packed.fetched)
            packed.fetched = None
            assert packed.device is not None
            return packed.device
        return packed

    def _fetch(self, sw: _Swap) -> None:
        if sw.device is not None:
            return
        rt = self.rt
        nbytes = sw.host.numel() * sw.host.element_size()
        rt.store.charge(Tier.DEVICE, nbytes, f"block {sw.block} swapped-in activation")
        self._blocks[sw.block].device_bytes += nbytes
        sw.device = torch.empty(sw.host.shape, dtype=sw.host.dtype, device=rt.device)
        sw.fetched = rt.mover.to_device(sw.device, sw.host, after=sw.event)
        rt.store.note_move(Tier.HOST, Tier.DEVICE, nbytes)

    def end_block(self, block: int) -> None:
        """Block ``block``'s forward is over: stop deduplicating (and holding) its saved tensors."""
        if block not in self._blocks:
            return
        acts = self._blocks[block]
        acts.seen.clear()
        if self.rt.profiling and self.rt.in_forward and self.rt.actions[block] is Action.SWAP:
            twin = self._twin(block)
            self._measured[twin] = max(self._measured.get(twin, 0), acts.saved_bytes)
            self._pinned[twin] = max(self._pinned.get(twin, 0), acts.pinned_bytes)

    def prefetch(self, block: int) -> None:
        """Start bringing block ``block``'s swapped activations back to the device."""
        if block in self._blocks:
            for sw in self._blocks[block].swaps:
                self._fetch(sw)

    def block_done(self, block: int) -> None:
        """Block ``block``'s backward is over: give its bytes back to the ledger."""
        acts = self._blocks.pop(block, None)
        if acts is None:
            return
        if self.rt.profiling:
            group = self.rt.groups[block]
            group.act_bytes = max(group.act_bytes, acts.saved_bytes)
            group.swap_host_bytes = max(group.swap_host_bytes, acts.pinned_bytes)
        self.rt.store.uncharge(Tier.DEVICE, acts.device_bytes)
        self.rt.store.uncharge(Tier.HOST, acts.host_bytes)

    def clear(self) -> None:
        """Forget every block's activations (end of a step)."""
        for block in list(self._blocks):
            self.block_done(block)
