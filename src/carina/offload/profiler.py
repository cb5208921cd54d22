"""Profiling: what the model's blocks cost, and what this machine's links and CPU can do.

The first ``profile_steps`` optimizer steps run under the conservative plan
(every block streamed, activations swapped) while the runtime records, per
block, the bytes autograd saved and the forward time. :func:`model_profile`
turns that record into the planner's :class:`ModelProfile`;
:func:`measure_hardware` times the host<->device copies and the CPU optimizer.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from carina.core.errors import ConfigError
from carina.offload.config import CpuOptimizerImpl
from carina.offload.simulator import BlockProfile, Hardware, ModelProfile

if TYPE_CHECKING:
    from carina.offload.blocks import ParamGroup
    from carina.offload.config import OffloadConfig

__all__ = [
    "host_memory_rate",
    "inner_kwargs",
    "measure_hardware",
    "model_profile",
    "optimizer_kwargs",
    "probe_numel",
    "state_bytes_per_param",
    "state_scalar_bytes",
]

_DEFAULT_DISK = 1.5e9


def model_profile(
    blocks: list[ParamGroup],
    rest: ParamGroup,
    *,
    other_act_bytes: int = 0,
    other_fwd_s: float = 0.0,
    head_workspace_bytes: int = 0,
    state_bytes: int = 8,
    state_scalars: int = 0,
    steps: int = 1,
    micro_batches: int = 1,
    fold_on_device: bool = False,
    narrow_grads: bool = False,
    staging: bool = True,
    rest_cast_on_device: bool = False,
) -> ModelProfile:
    """The planner's view of the model from the groups' recorded sizes and times.

    Args:
        blocks: The block groups (``act_bytes``/``fwd_s`` filled by profiling).
        rest: The group of non-block parameters.
        other_act_bytes: Bytes saved outside blocks (embeddings, head, loss).
        other_fwd_s: Forward seconds spent outside blocks.
        head_workspace_bytes: Transient bytes of the head and loss (not saved), see
            :mod:`carina.offload.workspace`.
        state_bytes: Optimizer state bytes per parameter.
        state_scalars: Optimizer state bytes per parameter tensor beside those (:func:`state_scalar_bytes`).
        steps: Forward passes the times were summed over.
        micro_batches: Backward passes per optimizer step (gradient accumulation).
        fold_on_device: Gradients reach the host gradient as float32 (the device folds them).
        narrow_grads: With one micro-batch, gradients reach the host in the compute dtype instead and
            the update upcasts them (:class:`~carina.offload.stepmodel.ModelProfile`).
        staging: The groups keep host gradient staging.
        rest_cast_on_device: The parameters outside blocks are cast on the device.
    """
    dtype = blocks[0].device.dtype if blocks else torch.float32
    item = torch.empty((), dtype=dtype).element_size()
    copy = 0 if dtype == torch.float32 else item  # the compute-dtype host copy of a group cast on the host
    return ModelProfile(
        blocks=tuple(
            BlockProfile(
                g.name, g.device_bytes, g.numel, g.act_bytes, max(g.fwd_s / max(1, steps), 1e-6), g.swap_host_bytes
            )
            for g in blocks
        ),
        resident_param_bytes=rest.device_bytes,
        resident_numel=rest.numel,
        other_act_bytes=other_act_bytes,
        other_fwd_s=max(0.0, other_fwd_s),
        state_bytes_per_param=state_bytes,
        copy_bytes_per_param=copy,
        staging_bytes_per_param=item if staging else 0,
        fold_on_device=fold_on_device,
        narrow_grads=narrow_grads,
        rest_cast_on_device=rest_cast_on_device,
        head_workspace_bytes=max(0, head_workspace_bytes),
        micro_batches=micro_batches,
        state_fixed_bytes=state_scalars * sum(len(g.masters) for g in [*blocks, rest]),
    )


def state_scalar_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer state bytes per parameter tensor beside the per-element state (AdamW: its step count, 4).

    Probed: ``optimizer``'s class with its hyperparameters steps a two-element float32 parameter once,
    and what the state holds in tensors of at most one element counts. The runtime keeps those in host
    RAM for every tensor (only per-element state spills to NVMe) and charges them to the ledger.
    """
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.zeros(2)
    try:
        probe = type(optimizer)([param], **optimizer_kwargs(optimizer))
        probe.step()
    except (TypeError, ValueError, RuntimeError):  # a class that cannot step alone like this (LBFGS needs a closure)
        return 4
    state = probe.state.get(param, {}).values()
    return sum(t.numel() * t.element_size() for t in state if isinstance(t, torch.Tensor) and t.numel() <= 1)


def state_bytes_per_param(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer state bytes per parameter: 8 for Adam-style (m, v in fp32), 4 with momentum, else 8."""
    name = type(optimizer).__name__.lower()
    if "adam" in name or "lamb" in name:
        return 8
    if "sgd" in name:
        return 4 if optimizer.defaults.get("momentum", 0) else 0
    return 8


def optimizer_kwargs(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The constructor arguments of ``optimizer`` found in its defaults."""
    params = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def inner_kwargs(user: torch.optim.Optimizer, cfg: OffloadConfig, device: torch.device) -> dict[str, Any]:
    """The user's optimizer settings for the CPU masters, with the fused CPU kernel where ``cfg`` asks for it."""
    kwargs = optimizer_kwargs(user)
    if "fused" not in kwargs or cfg.cpu_optimizer is CpuOptimizerImpl.AS_GIVEN:
        if cfg.cpu_optimizer is CpuOptimizerImpl.FUSED:
            raise ConfigError(f"{type(user).__name__} has no fused implementation", key="cpu_optimizer")
        return kwargs
    chosen = kwargs.get("fused") is not None or kwargs.get("foreach") is not None
    if cfg.cpu_optimizer is CpuOptimizerImpl.FUSED or (device.type == "cuda" and not chosen):
        kwargs.update(fused=True, foreach=None)
    return kwargs


def _copy_rate(src: torch.Tensor, dst: torch.Tensor, cuda: bool) -> float:
    dst.copy_(src, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    reps = 5
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    return reps * src.numel() / max(time.perf_counter() - t0, 1e-9)


#: Elements of the CPU optimizer probe, at most: big enough that one step's fixed cost (the Python
#: step, the thread team's fork/join, about 0.1 ms) is a few percent of the kernel even on 16 cores.
OPTIM_PROBE_MAX = 1 << 25
#: Host bytes per element of the optimizer probe beside its state: parameter, gradient and the
#: temporaries of an unfused step (two float32 tensors); 24 B with AdamW, as measured on the CPU.
OPTIM_PROBE_OVERHEAD = 16
#: Elements of a probe at least, however little room the host budget leaves (a few MB).
PROBE_MIN = 1 << 16


def probe_numel(numel: int, bytes_per_element: int, host_room: int | None) -> int:
    """Elements of a probe of ``numel`` elements at most that takes at most ``host_room`` bytes.

    Args:
        numel: The probe's size without a limit.
        bytes_per_element: Host bytes the probe takes per element (every tensor it allocates).
        host_room: Host bytes it may take (None: no limit); at least :data:`PROBE_MIN` elements.
    """
    if host_room is not None:
        numel = min(numel, max(0, host_room) // max(1, bytes_per_element))
    return max(PROBE_MIN, numel)


def _optimizer_rate(optimizer: torch.optim.Optimizer, numel: int = 1 << 20, threads: int = 0) -> float:
    """Params/s of one step of ``optimizer``'s class and settings over one ``numel``-element tensor.

    With ``threads``, this thread's intra-op team has that size while the probe runs (the
    worker's size), then its own again. The probe runs here, not on the worker: each thread
    allocates from its own malloc arena, and a probe's freed tensors there would stay in RSS.
    """
    with _team(threads):
        p = torch.nn.Parameter(torch.zeros(numel))
        p.grad = torch.full((numel,), 1e-3)
        opt = type(optimizer)([p], **optimizer_kwargs(optimizer))
        opt.step()
        t0 = time.perf_counter()
        reps = 3
        for _ in range(reps):
            opt.step()
        return reps * numel / max(time.perf_counter() - t0, 1e-9)


@contextlib.contextmanager
def _team(threads: int) -> Iterator[None]:
    """This thread's intra-op team has ``threads`` threads for the body (0: as it is)."""
    before = torch.get_num_threads()
    if threads and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads and threads != before:
            torch.set_num_threads(before)


def measure_hardware(
    device: torch.device,
    cfg: OffloadConfig,
    optimizer: torch.optim.Optimizer,
    *,
    block_numel: int = 1 << 20,
    threads: int = 0,
    compute_dtype: torch.dtype = torch.float32,
    host_room: int | None = None,
) -> Hardware:
    """Rates for the plan: configured ones where given, else measured here (a fraction of a second).

    Args:
        device: The compute device.
        cfg: The offload config (its rate overrides win).
        optimizer: The CPU optimizer (its class and settings are probed).
        block_numel: Parameters of the largest block: the optimizer probe steps a tensor that
            large (at most :data:`OPTIM_PROBE_MAX`), as the real updates do.
        threads: Intra-op threads of the thread the real updates run on (0: this thread's).
        compute_dtype: The device's dtype: the gradient fold (staged gradient into float32) and
            the cast (float32 master into the host copy) are timed between it and float32, over
            a block-sized buffer with the worker's thread count, like the update. The host
            memory's bandwidth is :func:`host_memory_rate` of an in-place pass and the update.
        host_room: Host bytes the probes may take (None: no limit): the host budget less what
            carina holds when the plan is made. Each probe is one at a time and shrunk to fit
            (:func:`probe_numel`; at least :data:`PROBE_MIN` elements): at full size the optimizer
            probe alone took 805 MB beside a full training state (24 B x 2**25 elements).
    """
    cuda = device.type == "cuda"
    nbytes = probe_numel((64 if cuda else 16) << 20, 1, host_room)
    h2d, d2h = cfg.h2d_gbps * 1e9, cfg.d2h_gbps * 1e9
    if not (h2d and d2h):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        h2d = h2d or _copy_rate(host, dev, cuda)
        d2h = d2h or _copy_rate(dev, host, cuda)
    optim = cfg.cpu_optimizer_gparams * 1e9
    if not optim:
        per = OPTIM_PROBE_OVERHEAD + state_bytes_per_param(optimizer)
        numel = probe_numel(min(block_numel, OPTIM_PROBE_MAX), per, host_room)
        optim = _optimizer_rate(optimizer, numel, threads)
    disk = cfg.disk_gbps * 1e9 or _DEFAULT_DISK
    item = torch.empty((), dtype=compute_dtype).element_size()
    numel = probe_numel(min(block_numel, PASS_PROBE_MAX), 4 + item, host_room)
    add = _pass_rate("add", compute_dtype, numel, threads) if cfg.grad_accumulation > 1 else 4e9
    fold = _pass_rate("fold", compute_dtype, numel, threads)
    cast = _pass_rate("cast", compute_dtype, numel, threads) if compute_dtype != torch.float32 else 1e10
    state = state_bytes_per_param(optimizer)
    host_numel = probe_numel(HOST_PROBE_NUMEL if cuda else 1 << 22, 4, host_room)
    mem = cfg.host_mem_gbps * 1e9 or host_memory_rate(optim, state, _host_pass_rate(host_numel, threads))
    return Hardware(h2d=h2d, d2h=d2h, optim=optim, disk=disk, grad_add=add, fold=fold, cast=cast, host_mem=mem)


def host_memory_rate(optim: float, state_bytes: int, measured: float = 0.0) -> float:
    """Host memory bytes/s (read plus written) for the plan: the larger of two lower bounds.

    ``measured`` is an in-place pass's rate (:func:`_host_pass_rate`); ``optim`` parameters/s
    of the CPU optimizer alone moved ``12 + 2 * state_bytes`` bytes each (master, gradient and
    state read, master and state written), so the memory carries at least that too.
    """
    return max(measured, optim * (12 + 2 * state_bytes))


#: Float32 elements of the host memory probe on a CUDA machine (512 MiB: far beyond the caches).
HOST_PROBE_NUMEL = 1 << 27


def _host_pass_rate(numel: int, threads: int = 0) -> float:
    """Bytes/s read plus written by an in-place float32 add over ``numel`` elements.

    The pass reads and writes every byte once, as the optimizer's in-place updates do; the
    probe is larger than the caches on a CUDA machine (:data:`HOST_PROBE_NUMEL`) and small on a
    CPU-only one (there, the optimizer's own rate usually bounds it).
    """
    with _team(threads):
        buf = torch.zeros(numel)
        buf.add_(1.0)
        reps = 3
        t0 = time.perf_counter()
        for _ in range(reps):
            buf.add_(1.0)
        return reps * 8 * numel / max(time.perf_counter() - t0, 1e-9)


#: Elements of the fold/add/cast probes, at most (a block of the 7B shape has 202M).
PASS_PROBE_MAX = 1 << 24


def _pass_rate(kind: str, dtype: torch.dtype, numel: int, threads: int = 0) -> float:
    """Elements/s of one pass the CPU worker makes between ``dtype`` and float32.

    ``add``: a staged gradient added into the float32 gradient (host accumulation); ``fold``:
    copied into it (the first micro-batch); ``cast``: a float32 master cast into the host copy.
    With ``threads``, this thread's intra-op team has that size while the probe runs.
    """
    with _team(threads):
        wide, narrow = torch.ones(numel), torch.ones(numel, dtype=dtype)
        dst, src = (narrow, wide) if kind == "cast" else (wide, narrow)
        op = dst.add_ if kind == "add" else dst.copy_
        op(src)
        reps = 3
        t0 = time.perf_counter()
        for _ in range(reps):
            op(src)
        return reps * numel / max(time.perf_counter() - t0, 1e-9)
