"""The offload configuration: budgets, activation policy, prefetch, precision."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from carina.core.config import Config, require

__all__ = [
    "ActivationPolicy",
    "AllocatorMode",
    "ComputeDtype",
    "ConvertOn",
    "CpuOptimizerImpl",
    "OffloadConfig",
    "OverlapMode",
    "ResidentMode",
]


class ActivationPolicy(enum.Enum):
    """What happens to a block's saved activations between forward and backward."""

    PLAN = "plan"  # the planner chooses per block (keep, swap or recompute)
    KEEP = "keep"  # stay on the device
    SWAP = "swap"  # copied to host RAM, copied back for backward
    RECOMPUTE = "recompute"  # dropped, the block's forward runs again in backward


class OverlapMode(enum.Enum):
    """When the CPU optimizer updates a block."""

    AUTO = "auto"  # during backward when exact (no clipping), else at optimizer.step()
    BACKWARD = "backward"  # as soon as the block's gradients are final (Ratel's active offloading)
    STEP = "step"  # all blocks at optimizer.step()


class ComputeDtype(enum.Enum):
    """Dtype of the parameters the device computes with (masters stay float32)."""

    AUTO = "auto"  # the model's own dtype
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class AllocatorMode(enum.Enum):
    """How carina sets up PyTorch's CUDA caching allocator."""

    AUTO = "auto"  # expandable segments, unless PYTORCH_CUDA_ALLOC_CONF already says how to allocate
    EXPANDABLE = "expandable"  # always expandable segments
    AS_IS = "as_is"  # leave the allocator alone


class CpuOptimizerImpl(enum.Enum):
    """Which implementation of the user's optimizer updates the float32 masters on the CPU."""

    AUTO = "auto"  # fused when the device computes and the user chose no implementation; else as given
    AS_GIVEN = "as_given"  # exactly the user's settings (bitwise equal to plain CPU training)
    FUSED = "fused"  # the fused CPU kernel (Adam, AdamW, SGD, Adagrad)


class ConvertOn(enum.Enum):
    """Where a dtype conversion between the compute dtype and float32 runs: the host or the device.

    Used for the gradient fold (compute-dtype gradient into the float32 host gradient) and the
    parameter cast (float32 master into the compute dtype the device computes with). On the
    host each is a pass over host memory on the CPU optimizer's thread; on the device the
    conversion is a kernel on the GPU and the link carries float32 (4 bytes per element).
    """

    AUTO = "auto"  # fold: on the device; cast: the planner chooses per block (device while profiling)
    HOST = "host"  # on the CPU optimizer's thread (host staging / a compute-dtype host copy)
    DEVICE = "device"  # on the device (no host staging / no host copy)


class ResidentMode(enum.Enum):
    """Whether a model whose whole training state fits the device trains there, with no offload at all."""

    AUTO = "auto"  # resident when the plan's bytes (activations included) fit the device budget
    ON = "on"  # resident; CapacityError when the parameters, gradients and optimizer state do not fit
    OFF = "off"  # always offload (host masters, CPU optimizer, streamed blocks)


@dataclass(kw_only=True)
class OffloadConfig(Config):
    """How :func:`carina.offload.wrap` runs a model larger than its device budget.

    Attributes:
        device: ``"auto"`` (CUDA when present, else CPU), ``"cuda"``, ``"cuda:N"`` or ``"cpu"``.
        device_budget: Bytes of device memory carina may use (None: what the device has).
        host_budget: Bytes of host RAM carina may hold (None: unlimited): masters, gradients,
            optimizer state, swapped activations, the pinned slabs' unused tails, the spill slot,
            and its transient buffers (the profiling steps' pinned swaps, the plan's hardware
            probes). A plan that cannot fit raises ``CapacityError`` at ``wrap`` or at the first
            ``step()``. The rest of the process is not in it: the interpreter, torch and other
            libraries, a CUDA context (``carina.offload.process_baseline(model)`` measures it before
            ``wrap``, and ``handle_of(model).process_baseline`` keeps what it was at ``wrap``; on the CPU:
            ``benchmarks/results/cpu/offload_host_rss.json``). To bound the whole process, pass the limit less
            that baseline and a margin for allocator retention (``docs/offload.md``).
        nvme_path: Directory for the NVMe tier (optimizer state spills there).
        nvme_budget: Bytes of the NVMe tier (0: no NVMe tier).
        activations: Activation policy; ``plan`` lets the planner choose per block.
        prefetch_depth: Blocks whose parameters are fetched ahead of use (>= 1).
        activation_lead: Blocks below the one backward enters whose swapped activations it fetches
            back then (0 = the planner chooses, 1..8 = that many).
        profile_steps: Optimizer steps run under the conservative plan while profiling (times
            come from the last one; the first pays warm-up).
        profile_host_fraction: Host RAM the profiling steps may fill with swapped activations,
            as a fraction of the host bytes of parameters and optimizer state (and never more
            than ``host_budget`` leaves). Once it is spent, a block whose twin (same class and
            parameter shapes) was already measured runs under recompute and takes the twin's
            activation bytes; the first block of each kind is always measured.
        compute_dtype: Parameter dtype on the device; masters and optimizer state are float32.
        max_grad_norm: Global-norm clipping over all (offloaded) gradients; None = off.
        grad_accumulation: Backward passes per optimizer step (the last one may overlap the update).
        accumulate_on_device: With ``grad_accumulation > 1``, let the planner keep blocks' float32
            gradient sums on the device across micro-batches where the budget allows (only the
            final sum crosses PCIe; the CPU adds nothing). False: every micro-batch's gradients
            go to host staging and the CPU worker adds them.
        overlap: When the CPU optimizer runs, see :class:`OverlapMode`.
        blocks: Dotted names of the repeated blocks; empty = found automatically.
        h2d_gbps: Host-to-device bandwidth for the plan (0 = measure).
        d2h_gbps: Device-to-host bandwidth for the plan (0 = measure).
        cpu_optimizer_gparams: CPU optimizer throughput in Gparam/s for the plan (0 = measure).
        disk_gbps: NVMe bandwidth for the plan (0 = assume 1.5 GB/s).
        host_mem_gbps: Host memory bandwidth (bytes read plus written) for the plan, shared by the
            CPU optimizer and the pinned copies (0 = measure, see
            :func:`~carina.offload.profiler.host_memory_rate`).
        allocator_headroom: Fraction of ``device_budget`` the plan leaves unused on CUDA for
            what carina does not model: the caching allocator's fragmentation (reserved minus
            allocated bytes) and library workspaces (cuBLAS, attention kernels). The plan's
            simulated peak must fit ``device_budget * (1 - allocator_headroom)``. CPUs have no
            caching allocator; there the whole budget is planned.
        allocator: The CUDA caching allocator's mode, see :class:`AllocatorMode`. Streaming
            blocks of many sizes through a fixed budget fragments fixed-size segments (seen on
            an H100: 2.2 GiB reserved but unallocated under an 8 GiB cap, so a 1 GiB logits
            buffer did not fit); expandable segments remap freed pages instead.
        cpu_optimizer: Which implementation updates the masters, see :class:`CpuOptimizerImpl`.
            PyTorch's default for CPU tensors is its per-tensor loop, about 5x slower than
            the fused CPU kernel on 16 cores; with a CUDA device the user's own step would
            not have run on the CPU at all, so ``auto`` takes the fused kernel there.
        cpu_optimizer_threads: Intra-op threads of the CPU optimizer worker (0 = auto: with a
            CUDA device one fewer than PyTorch's intra-op threads, leaving a core to the thread
            that runs the hooks and issues GPU work, since the kernels split their work evenly
            and a team with one thread short of a core waits for it; with a CPU device, which
            computes on those threads too, PyTorch's count).
        step_barrier: Make ``optimizer.step()`` wait for every block's update. False (the default
            since the CUDA tests of the carry-over passed on an H200 in session 5, run by
            ``benchmarks/offload/lane_s2_h200.sh``): a block updated during backward (one flat fused
            call, see :mod:`carina.offload.flatstep`) may still be updating when ``step()``
            returns: the next forward fetches each block once its own update is done, and the
            worker updates blocks in the order that forward needs them, so the next forward
            overlaps the last updates. Its hyperparameters are copied when it is queued, so an LR
            scheduler stepped meanwhile does not reach it; results are the same either way.
        grad_fold: Where a block's gradients become float32 (:class:`ConvertOn`). ``host``: gradients
            land in host staging in the compute dtype and the CPU worker folds them. ``device``
            (and ``auto``, the default since the device paths' CUDA tests passed on an H200):
            each gradient is converted on the device and copied straight into the float32 host
            gradient, so the CPU does no fold pass and no host staging is kept (unless
            micro-batches are added on the host); the copy carries 4 bytes per parameter instead
            of the compute dtype's.
        narrow_grads: With one micro-batch, no clipping and a compute dtype narrower than float32,
            send a block updated by one flat fused call its gradient in the compute dtype (2 bytes
            per parameter with bf16, not 4) and upcast it inside the update, chunk by chunk: the
            same bits as the float32 path, with fewer bytes over the link and through host memory.
            False by default: bitwise on the CPU and on an H200, but measured slower there in
            session 9 (the chunked update ran at 2.88 Gparam/s alone against 4.95 for the float32
            path; 8k tokens/step fell from 7,955 to 5,804 tokens/s: ``h200/s9``), so opt-in.
        param_cast: Where updated float32 masters become the compute dtype (:class:`ConvertOn`).
            ``host``: the CPU worker casts each updated block into a compute-dtype host copy
            that feeds the device (2 bytes per parameter of host RAM with bf16). ``device``:
            the float32 master is copied to the device in chunks and cast there (no host
            copy, no cast pass; twice the host-to-device bytes). ``auto``: the planner
            chooses per block (device while profiling); the default since the device paths' CUDA
            tests passed on an H200. No effect with float32 compute.
        resident: Whether a model that fits the device trains as plain PyTorch would
            (:class:`ResidentMode`, :mod:`carina.offload.resident`): everything on the device,
            the user's optimizer (class, param groups, hyperparameters, fused/foreach) stepping
            there, no hooks on the forward or backward, no host masters, no pinned slabs.
            ``auto`` plans it when the closed-form device bytes fit the device budget (less
            ``allocator_headroom`` on CUDA): parameters, float32 masters when the compute dtype
            is narrower, gradients, optimizer state, every block's saved activations at
            ``micro_batch_tokens`` and the head's workspace; with those activations unknown it
            offloads.
        micro_batch_tokens: Tokens per micro-batch (sequences times sequence length), to size
            the activations before anything runs (0: unknown). Estimated from the model's
            transformers config (Llama, Mistral/Qwen2-style shapes, :mod:`carina.offload.estimate`).
        head_chunk_tokens: Tokens per chunk of the head and loss when the loop uses
            :func:`carina.offload.chunked_lm_loss` with this ``chunk_tokens`` (0: the plain loss), so
            the estimate at ``micro_batch_tokens`` sizes the head's workspace as one chunk's.
        step_timing: Record where each step's time goes (:mod:`carina.offload.timing`): compute,
            recompute, waits on streamed weights, swapped activations and the CPU optimizer,
            and the optimizer's own work. For benchmarks; off by default.
    """

    device: str = "auto"
    device_budget: int | None = None
    host_budget: int | None = None
    nvme_path: Path | None = None
    nvme_budget: int = 0
    activations: ActivationPolicy = ActivationPolicy.PLAN
    prefetch_depth: int = 1
    activation_lead: int = 0
    profile_steps: int = 2
    profile_host_fraction: float = 0.1
    compute_dtype: ComputeDtype = ComputeDtype.AUTO
    max_grad_norm: float | None = None
    grad_accumulation: int = 1
    accumulate_on_device: bool = True
    overlap: OverlapMode = OverlapMode.AUTO
    blocks: list[str] = field(default_factory=list)
    h2d_gbps: float = 0.0
    d2h_gbps: float = 0.0
    cpu_optimizer_gparams: float = 0.0
    disk_gbps: float = 0.0
    host_mem_gbps: float = 0.0
    allocator_headroom: float = 0.05
    allocator: AllocatorMode = AllocatorMode.AUTO
    cpu_optimizer: CpuOptimizerImpl = CpuOptimizerImpl.AUTO
    cpu_optimizer_threads: int = 0
    step_barrier: bool = False
    grad_fold: ConvertOn = ConvertOn.AUTO
    param_cast: ConvertOn = ConvertOn.AUTO
    narrow_grads: bool = False
    resident: ResidentMode = ResidentMode.AUTO
    micro_batch_tokens: int = 0
    head_chunk_tokens: int = 0
    step_timing: bool = False

    def validate(self) -> None:
        """Check ranges and combinations."""
        require(
            self.device in {"auto", "cpu"} or self.device.startswith("cuda"),
            f"device must be auto, cpu or cuda[:N], got {self.device!r}",
            key="device",
        )
        for name in ("device_budget", "host_budget"):
            value = getattr(self, name)
            require(value is None or value > 0, f"{name} must be positive", key=name)
        require(self.nvme_budget >= 0, "nvme_budget must be >= 0", key="nvme_budget")
        require(self.nvme_budget == 0 or self.nvme_path is not None, "nvme_budget needs nvme_path", key="nvme_path")
        require(1 <= self.prefetch_depth <= 8, "prefetch_depth must be in 1..8", key="prefetch_depth")
        require(0 <= self.activation_lead <= 8, "activation_lead must be in 0..8 (0: planned)", key="activation_lead")
        require(self.profile_steps >= 1, "profile_steps must be >= 1", key="profile_steps")
        require(
            0.0 <= self.profile_host_fraction <= 10.0,
            "profile_host_fraction must be in [0, 10]",
            key="profile_host_fraction",
        )
        require(self.grad_accumulation >= 1, "grad_accumulation must be >= 1", key="grad_accumulation")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm must be > 0", key="max_grad_norm")
        require(
            not (self.overlap is OverlapMode.BACKWARD and self.max_grad_norm is not None),
            "overlap='backward' cannot clip exactly (the norm needs every gradient first); use 'auto' or 'step'",
            key="overlap",
        )
        require(
            0.0 <= self.allocator_headroom < 0.9,
            "allocator_headroom must be in [0, 0.9)",
            key="allocator_headroom",
        )
        require(
            0 <= self.cpu_optimizer_threads <= 1024,
            "cpu_optimizer_threads must be in 0..1024 (0: auto)",
            key="cpu_optimizer_threads",
        )
        require(self.micro_batch_tokens >= 0, "micro_batch_tokens must be >= 0 (0: unknown)", key="micro_batch_tokens")
        require(self.head_chunk_tokens >= 0, "head_chunk_tokens must be >= 0 (0: plain loss)", key="head_chunk_tokens")
        for name in ("h2d_gbps", "d2h_gbps", "cpu_optimizer_gparams", "disk_gbps", "host_mem_gbps"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0", key=name)

    def resolved_device(self) -> str:
        """The device string with ``auto`` resolved."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
