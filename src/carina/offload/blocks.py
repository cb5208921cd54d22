"""Finding a model's repeated blocks and laying their parameters out in flat buffers.

Each :class:`ParamGroup` (a block, or the parameters outside blocks) owns
three flat buffers: the float32 master weights and the float32 gradients in
host RAM, and the device buffer in the compute dtype whose storage is freed
whenever the group is not resident. A block the plan lets accumulate its
gradients on the device also owns a float32 device accumulator. The module's parameters become views of
the device buffer, so freeing and refilling that one storage makes them (and
every view autograd saved of them) empty or valid again. Two host buffers exist
only where they are used: gradient staging in the compute dtype (when gradients
are folded on the host, or micro-batches added there) and a host copy in the
compute dtype that feeds the device (when the cast runs on the host; it is the
master itself when both are float32, and absent when the device casts).
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from carina.core.errors import ConfigError
from carina.memory.store import TensorStore
from carina.memory.tiers import Tier

__all__ = [
    "HostBuffers",
    "HostLayout",
    "ParamGroup",
    "build_groups",
    "find_blocks",
    "host_buffer_sizes",
    "partition",
    "release_device",
    "restore_device",
]


def find_blocks(model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    """The repeated blocks: the modules named in ``names`` (a ModuleList expands), else found.

    Found automatically: the ``nn.ModuleList`` holding the most parameters whose
    children all share one class (decoder layers of Llama, Mistral, Qwen2, GPT-2).

    Raises:
        ConfigError: A name does not exist, or no repeated blocks were found.
    """
    if names:
        out: list[tuple[str, nn.Module]] = []
        for name in names:
            try:
                mod = model.get_submodule(name)
            except AttributeError:
                raise ConfigError(f"model has no submodule {name!r}", key="blocks") from None
            if isinstance(mod, nn.ModuleList):
                out.extend((f"{name}.{i}", m) for i, m in enumerate(mod))
            else:
                out.append((name, mod))
        return out
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) >= 2 and len({type(m) for m in mod}) == 1:
            size = sum(p.numel() for p in mod.parameters())
            if best is None or size > best[0]:
                best = (size, name, mod)
    if best is None:
        raise ConfigError("no repeated blocks found; name them with OffloadConfig.blocks", key="blocks")
    return [(f"{best[1]}.{i}", m) for i, m in enumerate(best[2])]


@dataclass(eq=False)
class ParamGroup:
    """One block's (or the non-block) parameters and their buffers in every tier."""

    index: int
    name: str
    module: nn.Module | None
    params: list[nn.Parameter]
    offsets: list[int]
    master: torch.Tensor  # fp32 flat, host
    grad: torch.Tensor  # fp32 flat, host
    staging: torch.Tensor | None  # compute-dtype flat, host: gradients folded on the host land here first
    host_copy: torch.Tensor | None  # compute-dtype flat, host (the master when fp32; None: cast on the device)
    device: torch.Tensor  # compute-dtype flat, device; storage freed when not resident
    resident: bool = False
    on_device: bool = True
    stale: bool = False  # host copy newer than the device buffer
    fetch_event: Any = None
    events: list[Any] = field(default_factory=list)
    masters: list[nn.Parameter] = field(default_factory=list)
    grads_seen: int = 0
    has_grad: bool = False
    queued: bool = False  # this step's update is queued on the CPU worker (during backward)
    detached: bool = False  # that update may finish after optimizer.step() returns (its use waits for it)
    pending: list[cf.Future[Any]] = field(default_factory=list)  # every CPU task queued for the group
    updates: list[cf.Future[Any]] = field(default_factory=list)  # the tasks that rewrite its host copy
    acc: torch.Tensor | None = None  # float32 flat, device: gradients summed over micro-batches (planned)
    acc_count: int = 0  # micro-batches summed in ``acc`` and not shipped yet
    acc_event: Any = None  # the copy shipping ``acc`` to the host (``acc`` is reused after it)
    direct: bool = False  # this backward's gradients go to the host gradient as float32 (folded on the device)
    narrow: bool = False  # ... or, where the update can take them so, in the compute dtype (see narrow_grad)
    grad_mode: str = "host"  # this backward: "host" (staging), "acc" (add on device) or "ship" (add, send sum)
    act_bytes: int = 0
    swap_host_bytes: int = 0  # pinned host bytes its swapped activations took while profiling (0: not pinned)
    fwd_s: float = 0.0

    @property
    def numel(self) -> int:
        """Parameters in the group."""
        return int(self.master.numel())

    @property
    def feed(self) -> torch.Tensor:
        """The host buffer the device is filled from: the host copy, or the float32 master (cast on the device)."""
        return self.master if self.host_copy is None else self.host_copy

    def refresh_copy(self) -> None:
        """Cast the master into the host copy (nothing when there is none or it is the master)."""
        if self.host_copy is not None and self.host_copy is not self.master:
            self.host_copy.copy_(self.master)

    @property
    def narrow_grad(self) -> torch.Tensor:
        """The gradient in the compute dtype, in the first bytes of the float32 host gradient.

        A single micro-batch's gradient arrives here when it leaves the device in the dtype it was
        computed in (:attr:`narrow`); the update upcasts it (exactly) as it reads it. No more host RAM:
        the float32 buffer holds it, and its float32 contents are not read meanwhile.
        """
        return self.grad.view(self.device.dtype)[: self.numel]

    def widen_grad(self, chunk: int) -> None:
        """Make a compute-dtype gradient (:attr:`narrow`) the float32 gradient again, in place.

        For a path that reads the float32 gradient after all (a micro-batch added to it, an update
        that is not one flat call). Chunks go last first through a float32 buffer: each float32 chunk
        only overwrites compute-dtype elements at or above its own start, already read.
        """
        if not self.narrow:
            return
        n, src = self.numel, self.narrow_grad
        buf = torch.empty(min(n, chunk), dtype=torch.float32)
        for start in reversed(range(0, n, chunk)):
            stop = min(n, start + chunk)
            buf[: stop - start].copy_(src[start:stop])
            self.grad[start:stop].copy_(buf[: stop - start])
        self.narrow = False

    @property
    def device_bytes(self) -> int:
        """Bytes of the device buffer when resident."""
        return int(self.device.numel() * self.device.element_size())

    def slot(self, i: int) -> slice:
        """The flat range of parameter ``i``."""
        return slice(self.offsets[i], self.offsets[i] + self.params[i].numel())


HostAlloc = Callable[[tuple[int, ...], torch.dtype, str], torch.Tensor]


@dataclass(frozen=True)
class HostLayout:
    """Which optional host buffers the groups get when they are built."""

    staging: bool = True  # compute-dtype gradient staging (host fold or host accumulation)
    host_copy: bool = True  # compute-dtype copy feeding the device (host cast; always the master with fp32)


class HostBuffers:
    """Allocates the groups' host buffers: pinned slabs with CUDA, the store's host tier otherwise.

    Buffers may be added after the groups are built (a plan that stages or casts a block on the host).
    """

    def __init__(self, store: TensorStore, sizes: list[int]) -> None:
        from carina.offload.hostmem import PinnedSlabs, slab_plan, slab_size

        self.store = store
        self.slabs = PinnedSlabs(store, slab_size(sizes), plan=slab_plan(sizes)) if store.pinned else None

    @property
    def pinned_bytes(self) -> int:
        """Pinned bytes the slabs hold."""
        return self.slabs.reserved if self.slabs is not None else 0

    @property
    def slack_bytes(self) -> int:
        """Pinned bytes of the slabs that no buffer uses (their tails): host RAM beside the ledger's."""
        return self.slabs.reserved - self.slabs.carved if self.slabs is not None else 0

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
        """An uninitialised host tensor charged to the host tier."""
        if self.slabs is not None:
            return self.slabs.empty(shape, dtype, what)
        return self.store.empty(shape, dtype, Tier.HOST, what)

    def add_staging(self, g: ParamGroup) -> None:
        """Give ``g`` host gradient staging (if it has none)."""
        if g.staging is None:
            g.staging = self((g.numel,), g.device.dtype, f"{g.name} gradient staging")

    def add_host_copy(self, g: ParamGroup) -> None:
        """Give ``g`` a compute-dtype host copy of its masters (if it has none), filled now."""
        if g.host_copy is None:
            g.host_copy = self((g.numel,), g.device.dtype, f"{g.name} copy")
            g.refresh_copy()


def build_groups(
    named: list[tuple[str, nn.Module | None, list[nn.Parameter]]],
    store: TensorStore,
    compute_dtype: torch.dtype | None,
    layout: HostLayout | None = None,
) -> tuple[list[ParamGroup], HostBuffers]:
    """Move each group's parameters into flat host masters and device views (charged to ``store``).

    Groups with a module (the blocks) start released: their device storage is
    freed right after the views are made. The group without one stays resident.
    With pinned host memory the buffers are carved from power-of-two slabs
    (:mod:`carina.offload.hostmem`). Returns the groups and their host allocator.
    """
    layout = layout or HostLayout()
    host = HostBuffers(store, host_buffer_sizes(named, compute_dtype, layout))
    groups = []
    for i, (name, mod, params) in enumerate(named):
        group = _build(i, name, mod, params, store=store, compute_dtype=compute_dtype, host=host, layout=layout)
        if mod is not None:
            release_device(group, store)
        else:
            group.resident = True
        groups.append(group)
    return groups, host


def host_buffer_sizes(
    named: list[tuple[str, nn.Module | None, list[nn.Parameter]]], compute_dtype: torch.dtype | None, layout: HostLayout
) -> list[int]:
    """Bytes of every host buffer :func:`build_groups` makes, in the order it makes them."""
    sizes = []
    for _, _, params in named:
        numel = sum(p.numel() for p in params)
        item = torch.empty((), dtype=compute_dtype or (params[0].dtype if params else torch.float32)).element_size()
        sizes += [4 * numel, 4 * numel]
        sizes += [item * numel] if layout.staging else []
        sizes += [item * numel] if item != 4 and layout.host_copy else []
    return sizes


def release_device(group: ParamGroup, store: TensorStore) -> None:
    """Free the group's device storage (its parameter views become empty)."""
    if group.on_device:
        group.device.untyped_storage().resize_(0)
        store.uncharge(Tier.DEVICE, group.device_bytes)
        group.on_device = False


def restore_device(group: ParamGroup, store: TensorStore) -> None:
    """Reallocate the group's device storage (contents undefined until a copy fills it)."""
    if not group.on_device:
        store.charge(Tier.DEVICE, group.device_bytes, f"{group.name} parameters")
        group.device.untyped_storage().resize_(group.device_bytes)
        group.on_device = True


def _build(
    index: int,
    name: str,
    module: nn.Module | None,
    params: list[nn.Parameter],
    *,
    store: TensorStore,
    compute_dtype: torch.dtype | None,
    host: HostAlloc,
    layout: HostLayout,
) -> ParamGroup:
    dtype = compute_dtype or (params[0].dtype if params else torch.float32)
    for p in params:
        if not p.is_floating_point():
            raise ConfigError(f"parameter of {name} is not floating point ({p.dtype})", key="model")
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += p.numel()
    master = host((total,), torch.float32, f"{name} masters")
    grad = host((total,), torch.float32, f"{name} gradients")
    grad.zero_()
    staging = host((total,), dtype, f"{name} gradient staging") if layout.staging else None
    host_copy: torch.Tensor | None = master
    if dtype != torch.float32:
        host_copy = host((total,), dtype, f"{name} copy") if layout.host_copy else None
    device = store.empty((total,), dtype, Tier.DEVICE, f"{name} parameters")
    group = ParamGroup(index, name, module, params, offsets, master, grad, staging, host_copy, device)
    with torch.no_grad():
        for i, p in enumerate(params):
            sl = group.slot(i)
            master[sl].copy_(p.detach().reshape(-1))
            if host_copy is not None and host_copy is not master:
                host_copy[sl].copy_(master[sl])
            if module is None:
                device[sl].copy_(master[sl])
            p.data = device[sl].view(p.shape)
            mp = nn.Parameter(master[sl].view(p.shape))
            group.masters.append(mp)
    return group


def partition(model: nn.Module, blocks: list[tuple[str, nn.Module]]) -> list[tuple[str, Any, list[nn.Parameter]]]:
    """Group trainable parameters by block; shared ones and the rest go to the last group."""
    uses: dict[int, int] = {}
    for _, mod in blocks:
        for p in {id(q) for q in mod.parameters()}:
            uses[p] = uses.get(p, 0) + 1
    in_block: set[int] = set()
    named: list[tuple[str, Any, list[nn.Parameter]]] = []
    for name, mod in blocks:
        params = [p for p in mod.parameters() if p.requires_grad and uses[id(p)] == 1 and id(p) not in in_block]
        in_block.update(id(p) for p in params)
        named.append((name, mod, params))
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in in_block]
    named.append(("rest", None, rest))
    return named
