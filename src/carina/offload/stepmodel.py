"""What the planner reasons about: profiled sizes and times, measured rates, decisions, predictions.

:class:`ModelProfile` (per block: parameter bytes, saved activation bytes, forward
time), :class:`Hardware` (link bandwidths and the CPU worker's rates), the per-block
:class:`BlockPlan`, the predicted :class:`StepTime`, the simulated :class:`SimEvent`
and :func:`host_bytes`, the host and NVMe bytes a plan needs; :func:`resident_bytes`, the
device bytes of training with everything on the device (no offload). The timeline that
plays a step is :mod:`carina.offload.simulator`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "Action",
    "BlockPlan",
    "BlockProfile",
    "Hardware",
    "ModelProfile",
    "ResidentBytes",
    "SimEvent",
    "StepTime",
    "host_bytes",
    "logits_workspace_bytes",
    "resident_bytes",
]

#: Float32 copies of the logits live at once, beyond the saved ones, while a causal LM's loss runs
#: backward: the upcast (or the held logits), the loss gradient and the log-softmax gradient.
LOGITS_FP32_COPIES = 3


def logits_workspace_bytes(numel: int) -> int:
    """Transient head/loss bytes for ``numel`` logits when no allocator peak is measured."""
    return LOGITS_FP32_COPIES * 4 * numel


class Action(enum.Enum):
    """What a block's saved activations do between forward and backward."""

    KEEP = "keep"
    SWAP = "swap"
    RECOMPUTE = "recompute"


@dataclass(frozen=True)
class BlockProfile:
    """One repeated block as profiled: device bytes, parameters, activations, time."""

    name: str
    param_bytes: int
    numel: int
    act_bytes: int
    fwd_s: float
    swap_host_bytes: int = 0  # host bytes its swapped activations pin (PyTorch's pinned cache rounds up; 0: act_bytes)


@dataclass(frozen=True)
class ModelProfile:
    """The profiled model: its blocks and the parameters/activations outside them.

    ``other_act_bytes`` are tensors saved for backward outside the blocks (live from
    forward to backward); ``head_workspace_bytes`` are transient bytes the output
    layer and the loss allocate without saving them (logits, their float32 upcast,
    the loss gradients), live only while the head runs.
    """

    blocks: tuple[BlockProfile, ...]
    resident_param_bytes: int
    resident_numel: int
    other_act_bytes: int
    other_fwd_s: float
    state_bytes_per_param: int = 8  # AdamW m and v in float32
    copy_bytes_per_param: int = 0  # the compute-dtype host copy of a group cast on the host (0 with float32)
    staging_bytes_per_param: int = 0  # host gradient staging in the compute dtype (0: none kept)
    fold_on_device: bool = False  # a micro-batch's gradients reach the host gradient as float32 (no CPU fold)
    # with fold_on_device and one micro-batch: they reach it in the compute dtype instead, and the update
    # (one flat fused call per group, state not on NVMe) upcasts them chunk by chunk in the CPU caches
    narrow_grads: bool = False
    rest_cast_on_device: bool = False  # the parameters outside blocks are cast on the device
    bwd_over_fwd: float = 2.0
    head_workspace_bytes: int = 0
    micro_batches: int = 1  # backward passes per optimizer step (gradient accumulation)
    host_fixed_bytes: int = 0  # host bytes beside the per-parameter buffers: the pinned slabs' unused tails
    # optimizer state beside the per-element state: AdamW's step count, one scalar per parameter tensor of
    # every group (the ledger charges them); in host RAM whatever the plan, as only per-element state spills
    state_fixed_bytes: int = 0
    # spilled state read ahead and written back beside the update (carina.offload.spill); False: in series
    spill_pipeline: bool = True

    @property
    def numel(self) -> int:
        """All trainable parameters."""
        return self.resident_numel + sum(b.numel for b in self.blocks)

    @property
    def update_bytes_per_param(self) -> int:
        """Host memory bytes one update reads and writes per parameter (AdamW: 28).

        It reads the float32 master, the float32 gradient and the state, and writes the
        master and the state back.
        """
        return 4 + 4 + 4 + 2 * self.state_bytes_per_param

    def narrow(self, on_nvme: bool = False) -> bool:
        """Whether a group's gradients cross in the compute dtype (see ``narrow_grads``)."""
        return self.narrow_grads and self.fold_on_device and self.micro_batches == 1 and not on_nvme

    def kept_lifetimes(self) -> list[float]:
        """Seconds each block's kept activations live: the passes of the head and the blocks above it."""
        per_pass = 1 + self.bwd_over_fwd
        after, out = self.other_fwd_s * per_pass, []
        for b in reversed(self.blocks):
            out.append(after)
            after += b.fwd_s * per_pass
        return out[::-1]


@dataclass(frozen=True)
class Hardware:
    """Measured rates: bytes/s each way over PCIe, parameters/s of the CPU optimizer, disk bytes/s.

    ``grad_add`` is the CPU's rate (elements/s) of adding one micro-batch's staged
    gradient into the float32 host gradient (gradient accumulation on the host);
    ``fold`` of copying a staged gradient into it (the first micro-batch); ``cast``
    of casting updated float32 masters into the compute-dtype host copy.

    ``host_mem`` is the host memory's bandwidth in bytes/s (bytes read plus bytes written),
    shared by the CPU worker's passes and every pinned DMA byte (0: not modeled, unlimited).
    """

    h2d: float
    d2h: float
    optim: float
    disk: float
    grad_add: float = 4e9
    fold: float = 1e10
    cast: float = 1e10
    host_mem: float = 0.0


@dataclass(frozen=True)
class BlockPlan:
    """The decisions for one block."""

    resident: bool = False
    activation: Action = Action.RECOMPUTE
    state_on_nvme: bool = False
    grad_on_device: bool = False  # accumulate gradients over micro-batches in a float32 device buffer
    cast_on_device: bool = False  # fetch the float32 master and cast on the device (no host copy, no CPU cast)


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds per step, split by resource, and the bottleneck.

    ``cpu_optimizer`` is the CPU worker's whole time; ``cpu_update``, ``cpu_fold`` (folding
    and adding staged gradients) and ``cpu_cast`` split it. ``host_memory`` is the step's host
    memory traffic (``host_traffic`` bytes: the worker's passes, every pinned DMA byte, NVMe
    spill I/O) at ``host_bandwidth`` bytes/s (0 when the bandwidth is not modeled); when it is
    longer than the worker's passes alone, the worker's passes are stretched to it (they share
    the memory with the DMA running beside them).
    """

    compute: float
    h2d: float
    d2h: float
    cpu_optimizer: float
    disk: float
    predicted: float
    bottleneck: str
    cpu_update: float = 0.0
    cpu_fold: float = 0.0
    cpu_cast: float = 0.0
    host_memory: float = 0.0
    host_traffic: int = 0
    host_bandwidth: float = 0.0


@dataclass(frozen=True)
class SimEvent:
    """One compute event of the simulated step and the device bytes live during it."""

    kind: str  # "fwd" | "head" | "bwd"
    block: int
    device_bytes: int
    start: float
    end: float
    ready: float  # when this block's parameters were on the device


def host_bytes(prof: ModelProfile, blocks: tuple[BlockPlan, ...]) -> tuple[int, int]:
    """Host and NVMe bytes a plan needs (masters, gradients, staging, copies, states, swapped activations).

    Every byte the runtime charges to the host ledger: the per-parameter buffers, the optimizer state
    (per element, and the scalars beside it: ``state_fixed_bytes``), the slabs' unused tails, one
    spilled block's state while it is updated, and what swapped activations pin.
    """
    per_param = 4 + 4 + prof.staging_bytes_per_param  # master, gradient, staging
    host = prof.numel * per_param + prof.resident_numel * prof.state_bytes_per_param
    host += prof.host_fixed_bytes + prof.state_fixed_bytes
    if not prof.rest_cast_on_device:
        host += prof.resident_numel * prof.copy_bytes_per_param
    nvme = staged = 0
    for b, p in zip(prof.blocks, blocks, strict=True):
        if not p.cast_on_device:
            host += b.numel * prof.copy_bytes_per_param
        state = b.numel * prof.state_bytes_per_param
        if p.state_on_nvme:
            nvme += state
            staged = max(staged, state)  # one spilled block's state is in RAM during its update
        else:
            host += state
        if p.activation is Action.SWAP:
            host += b.swap_host_bytes or b.act_bytes
    return host + staged, nvme


@dataclass(frozen=True)
class ResidentBytes:
    """Device bytes of training with everything on the device, as plain PyTorch would (no offload).

    ``masters`` and ``master_grads`` are the float32 copies kept when the compute dtype is
    narrower (zero with float32 compute: the parameters are the masters); ``grads`` are the
    compute-dtype gradients autograd makes; ``activations`` every block's saved tensors kept
    (none recomputed) plus those saved outside the blocks; ``head_workspace`` the head's and
    the loss's transient bytes.
    """

    params: int
    masters: int
    grads: int
    master_grads: int
    optimizer_state: int
    activations: int
    head_workspace: int

    @property
    def total(self) -> int:
        """All of it: the device peak the resident plan counts."""
        return (
            self.params
            + self.masters
            + self.grads
            + self.master_grads
            + self.optimizer_state
            + self.activations
            + self.head_workspace
        )


def resident_bytes(prof: ModelProfile) -> ResidentBytes:
    """The closed-form device bytes of ``prof`` trained with everything on the device."""
    params = prof.resident_param_bytes + sum(b.param_bytes for b in prof.blocks)
    narrow = params != 4 * prof.numel  # a compute dtype narrower than the float32 masters
    return ResidentBytes(
        params=params,
        masters=4 * prof.numel if narrow else 0,
        grads=params,
        master_grads=4 * prof.numel if narrow else 0,
        optimizer_state=prof.state_bytes_per_param * prof.numel,
        activations=prof.other_act_bytes + sum(b.act_bytes for b in prof.blocks),
        head_workspace=prof.head_workspace_bytes,
    )
