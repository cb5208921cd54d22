"""The one verb: ``model, optimizer = carina.offload.wrap(model, config, optimizer=opt)``.

After wrapping, the user's loop keeps its shape (forward, ``loss.backward()``,
``optimizer.step()``, ``optimizer.zero_grad()``, LR schedulers). Parameters
live as float32 masters in host RAM and stream to the device block by block;
``model.state_dict()`` returns the masters, ``model.load_state_dict()`` writes
them, and the returned optimizer's ``state_dict()`` round-trips too. A model whose whole
training state fits the device (``Config(micro_batch_tokens=...)`` sizes its activations) is not
offloaded at all: it trains on the device as plain PyTorch would (:mod:`carina.offload.resident`).
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from carina.core.errors import ConfigError
from carina.memory.store import StoreStats, TensorStore, TierBudgets
from carina.memory.tiers import format_bytes
from carina.offload.blocks import find_blocks
from carina.offload.config import AllocatorMode, ComputeDtype, ConvertOn, OffloadConfig, ResidentMode
from carina.offload.hostmem import process_baseline
from carina.offload.planner import Plan, PlanBudgets, make_plan, resident_plan
from carina.offload.resident import ResidentOptimizer, ResidentRuntime
from carina.offload.runtime import OffloadRuntime
from carina.offload.session import OffloadOptimizer
from carina.offload.simulator import BlockProfile, Hardware, ModelProfile, resident_bytes

log = logging.getLogger("carina.offload")

__all__ = ["OffloadHandle", "handle_of", "pinned_slack", "static_profile", "wrap"]

_HANDLES: weakref.WeakKeyDictionary[nn.Module, OffloadHandle] = weakref.WeakKeyDictionary()
_NOMINAL = Hardware(h2d=25e9, d2h=25e9, optim=2e9, disk=1.5e9)
_DTYPES = {
    ComputeDtype.FLOAT32: torch.float32,
    ComputeDtype.BFLOAT16: torch.bfloat16,
    ComputeDtype.FLOAT16: torch.float16,
}


class OffloadHandle:
    """What carina keeps about a wrapped model: runtime, optimizer, ledger, plan.

    A resident model (the plan's mode ``resident``) has a :class:`ResidentRuntime` and a
    :class:`ResidentOptimizer` here: no hooks, no worker, nothing moved.
    """

    def __init__(
        self,
        runtime: OffloadRuntime | ResidentRuntime,
        optimizer: OffloadOptimizer | ResidentOptimizer,
        process_baseline: int | None = None,
    ) -> None:
        self.runtime = runtime
        self.optimizer = optimizer
        #: Resident bytes of the process beside the model's tensors when ``wrap`` began (None: not measured,
        #: or a resident model): outside ``host_budget`` (:func:`~carina.offload.hostmem.process_baseline`).
        self.process_baseline = process_baseline

    @property
    def config(self) -> OffloadConfig:
        """The config the model was wrapped with."""
        return self.runtime.cfg

    @property
    def plan(self) -> Plan | None:
        """The plan in force (None while profiling)."""
        return self.optimizer.plan

    @property
    def store(self) -> TensorStore:
        """The per-tier ledger."""
        return self.runtime.store

    def step_times(self) -> list[dict[str, float]]:
        """Each timed step's split (``Config(step_timing=True)``; see :mod:`carina.offload.timing`)."""
        timer = self.runtime.timer
        return list(timer.steps) if timer is not None else []

    def synchronize(self) -> None:
        """Wait until the CPU worker finished every queued update (see ``OffloadOptimizer.synchronize``)."""
        self.optimizer.synchronize()

    def stats(self) -> StoreStats:
        """Bytes used, peak and budget per tier, bytes moved per route."""
        return self.runtime.store.stats()

    def close(self) -> None:
        """Remove carina's hooks and forget the model (parameters stay where they are)."""
        self.runtime.close()
        _HANDLES.pop(self.runtime.model, None)


def handle_of(model: nn.Module) -> OffloadHandle:
    """The :class:`OffloadHandle` of a wrapped model."""
    try:
        return _HANDLES[model]
    except KeyError:
        raise ConfigError("this model was not wrapped by carina.offload.wrap", key="model") from None


def _budgets(cfg: OffloadConfig, device: torch.device) -> PlanBudgets:
    """The budgets the plan must fit: on CUDA, ``allocator_headroom`` of the device budget stays unplanned."""
    dev = cfg.device_budget
    if dev is None and device.type == "cuda":
        dev = int(torch.cuda.mem_get_info(device)[1] * 0.9)
    if dev is not None and device.type == "cuda":
        dev = int(dev * (1.0 - cfg.allocator_headroom))
    return PlanBudgets(device=dev, host=cfg.host_budget, nvme=cfg.nvme_budget)


def static_profile(
    model: nn.Module, cfg: OffloadConfig, state_bytes: int = 8, state_scalars: int = 0, *, pinned: bool = False
) -> ModelProfile:
    """A profile from parameter counts alone (no activations): enough to reject impossible budgets.

    ``state_scalars``: optimizer state bytes per parameter tensor beside the per-element ones
    (:func:`~carina.offload.profiler.state_scalar_bytes`). ``pinned``: the host buffers will be carved
    from pinned slabs (CUDA), whose unused tails the plan counts (:func:`pinned_slack`). What the
    profiling steps may swap to host RAM is the host budget less this profile's plan: without the
    tails (2.06 GB for the 7B shape cut to 16 layers) the H100 run of session 13 was allowed 0.46 GB
    of swaps where 16 MB was left.
    """
    blocks = find_blocks(model, cfg.blocks)
    dtype = _DTYPES.get(cfg.compute_dtype) or next(model.parameters()).dtype
    item = torch.empty((), dtype=dtype).element_size()
    seen: set[int] = set()
    profs = []
    for name, mod in blocks:
        params = [p for p in mod.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        numel = sum(p.numel() for p in params)
        profs.append(BlockProfile(name, numel * item, numel, 0, 1e-3))
    rest = sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in seen)
    fold = cfg.grad_fold is not ConvertOn.HOST
    tensors = len({id(p) for p in model.parameters() if p.requires_grad})
    return ModelProfile(
        tuple(profs),
        rest * item,
        rest,
        0,
        1e-3,
        state_bytes,
        copy_bytes_per_param=0 if dtype == torch.float32 else item,
        staging_bytes_per_param=item if not fold or cfg.grad_accumulation > 1 else 0,
        fold_on_device=fold,
        rest_cast_on_device=cfg.param_cast is not ConvertOn.HOST,
        state_fixed_bytes=state_scalars * tensors,
        host_fixed_bytes=pinned_slack(model, cfg) if pinned else 0,
    )


def pinned_slack(model: nn.Module, cfg: OffloadConfig) -> int:
    """Pinned bytes no buffer uses: the slabs' tails when the runtime builds its host buffers from slabs.

    The same slabs :class:`~carina.offload.blocks.HostBuffers` will ask for (:func:`~carina.offload.hostmem.slab_plan`
    of :func:`~carina.offload.blocks.host_buffer_sizes`), less the bytes carved from them. No memory is allocated.
    """
    from carina.offload.blocks import HostLayout, host_buffer_sizes, partition
    from carina.offload.hostmem import slab_plan

    layout = HostLayout(
        staging=cfg.grad_fold is ConvertOn.HOST or cfg.grad_accumulation > 1,
        host_copy=cfg.param_cast is ConvertOn.HOST,
    )
    sizes = host_buffer_sizes(partition(model, find_blocks(model, cfg.blocks)), _DTYPES.get(cfg.compute_dtype), layout)
    return sum(slab_plan(sizes)) - sum(sizes)


def wrap(
    model: nn.Module, config: OffloadConfig | None = None, *, optimizer: torch.optim.Optimizer
) -> tuple[nn.Module, OffloadOptimizer | ResidentOptimizer]:
    """Make ``model`` train beyond device memory; return it and the optimizer to step.

    Args:
        model: Any ``nn.Module`` with repeated blocks (transformers causal LMs are
            found automatically; otherwise name them in ``config.blocks``). It may
            live on the CPU; its parameters move into carina's tiers.
        config: Budgets and policies (defaults: whole device, plan per block).
        optimizer: The optimizer built over ``model.parameters()``, not stepped yet.

    Returns:
        The same model (hooked) and an optimizer to use in its place. When everything fits the
        device (``config.resident``, :mod:`carina.offload.resident`), the model is moved to the
        device unhooked and the optimizer is the user's, stepping there.

    Raises:
        CapacityError: The parameters and optimizer state cannot fit the budgets.
        ConfigError: Bad config, unknown block names, foreign optimizer parameters.
    """
    from carina.offload.profiler import state_bytes_per_param, state_scalar_bytes

    cfg = config or OffloadConfig()
    if model in _HANDLES:
        raise ConfigError("model is already wrapped", key="model")
    baseline = process_baseline(model)  # before carina allocates: what host_budget does not cover
    device = torch.device(cfg.resolved_device())
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    budgets = _budgets(cfg, device)
    whole = _resident_plan(model, cfg, state_bytes_per_param(optimizer), budgets)
    if whole is not None:
        return _wrap_resident(model, cfg, optimizer, whole, budgets, device)
    if device.type == "cuda":
        _set_up_allocator(cfg)
    pinned = torch.cuda.is_available()  # the store pins its host buffers where CUDA is available
    static = make_plan(
        static_profile(model, cfg, state_bytes_per_param(optimizer), state_scalar_bytes(optimizer), pinned=pinned),
        budgets,
        _NOMINAL,
        policy="recompute",
        prefetch_depth=cfg.prefetch_depth,
        cast="host" if cfg.param_cast is ConvertOn.HOST else "device",
    )
    store = TensorStore(
        TierBudgets(
            device=cfg.device_budget or budgets.device,
            host=cfg.host_budget,
            nvme=cfg.nvme_budget,
            nvme_path=cfg.nvme_path,
        ),
        device=str(device),
    )
    runtime = OffloadRuntime(model, find_blocks(model, cfg.blocks), cfg, store, _DTYPES.get(cfg.compute_dtype))
    runtime.acts.swap_allowance = _profile_allowance(cfg, static.host_bytes)
    opt = OffloadOptimizer(optimizer, runtime, budgets)
    opt.spill = {i for i, b in enumerate(static.blocks) if b.state_on_nvme}
    _HANDLES[model] = OffloadHandle(runtime, opt, baseline)
    if baseline is not None and cfg.host_budget is not None:
        log.info(
            "host: budget %s for carina; the process besides held %s at wrap (not in the budget)",
            format_bytes(cfg.host_budget),
            format_bytes(baseline),
        )
    _install_state_hooks(model, runtime)
    return model, opt


def _resident_plan(model: nn.Module, cfg: OffloadConfig, state_bytes: int, budgets: PlanBudgets) -> Plan | None:
    """The resident plan (:func:`~carina.offload.planner.resident_plan`) when ``cfg.resident`` allows and it fits."""
    if cfg.resident is ResidentMode.OFF:
        return None
    prof = static_profile(model, cfg, state_bytes)
    acts = _saved_estimate(model, cfg, prof)
    if acts is None and cfg.resident is ResidentMode.AUTO:
        log.info(
            "resident mode not planned: the activations are unknown (set micro_batch_tokens, with a transformers "
            "Llama-style config on the model, or resident='on'); offloading"
        )
        return None
    if acts is not None:
        block, other, workspace = acts
        blocks = tuple(replace(b, act_bytes=block) for b in prof.blocks)
        prof = replace(prof, blocks=blocks, other_act_bytes=other, head_workspace_bytes=workspace)
    plan = resident_plan(prof, budgets, required=cfg.resident is ResidentMode.ON)
    if plan is None:
        log.info(
            "resident mode not planned: the whole training state needs %s on the device, budget %s; offloading",
            format_bytes(resident_bytes(prof).total),
            format_bytes(budgets.device or 0),
        )
    return plan


def _saved_estimate(model: nn.Module, cfg: OffloadConfig, prof: ModelProfile) -> tuple[int, int, int] | None:
    """Activation bytes (per block, outside, head workspace) at ``cfg.micro_batch_tokens``, None when unknown."""
    from carina.offload.estimate import saved_bytes

    shape = getattr(model, "config", None)
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    if not cfg.micro_batch_tokens or not all(isinstance(getattr(shape, k, None), int) for k in keys):
        return None
    numel = sum(b.numel for b in prof.blocks) + prof.resident_numel
    item = max(1, (sum(b.param_bytes for b in prof.blocks) + prof.resident_param_bytes) // max(1, numel))
    return saved_bytes(shape, cfg.micro_batch_tokens, item, cfg.head_chunk_tokens)


def _wrap_resident(
    model: nn.Module,
    cfg: OffloadConfig,
    optimizer: torch.optim.Optimizer,
    plan: Plan,
    budgets: PlanBudgets,
    device: torch.device,
) -> tuple[nn.Module, ResidentOptimizer]:
    """Everything on the device, the user's optimizer stepping there (:mod:`carina.offload.resident`)."""
    store = TensorStore(TierBudgets(device=cfg.device_budget or budgets.device, host=cfg.host_budget),
                        device=str(device))  # fmt: skip
    runtime = ResidentRuntime(model, cfg, store, _DTYPES.get(cfg.compute_dtype))
    opt = ResidentOptimizer(optimizer, runtime, plan)
    _HANDLES[model] = OffloadHandle(runtime, opt)
    log.info("offload plan: %s", plan.tier)
    return model, opt


def _profile_allowance(cfg: OffloadConfig, host_need: int) -> int:
    """Host bytes the profiling steps may swap activations into (beside parameters and optimizer state)."""
    allowance = int(cfg.profile_host_fraction * host_need)
    if cfg.host_budget is not None:
        allowance = min(allowance, max(0, cfg.host_budget - host_need))
    return allowance


def _set_up_allocator(cfg: OffloadConfig) -> None:
    """Expandable segments for the CUDA caching allocator when ``cfg.allocator`` asks for them."""
    if cfg.allocator is AllocatorMode.AS_IS:
        return
    if cfg.allocator is AllocatorMode.AUTO and os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        log.info("allocator: PYTORCH_CUDA_ALLOC_CONF is set, carina leaves the allocator as it is")
        return
    _allocator_setter()("expandable_segments:True")
    log.info("allocator: expandable segments (carina's default with a CUDA device; allocator='as_is' keeps yours)")


def _allocator_setter() -> Any:
    """The allocator-settings call of this torch: the accelerator-generic one where it exists.

    torch 2.11 deprecates ``torch.cuda.memory._set_allocator_settings`` (a FutureWarning on every call) in
    favour of ``torch._C._accelerator_setAllocatorSettings``; older releases have only the former.
    """
    new = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    return new if new is not None else torch.cuda.memory._set_allocator_settings


def _install_state_hooks(model: nn.Module, rt: OffloadRuntime) -> None:
    names = {name: rt.owner[id(p)] for name, p in model.named_parameters(remove_duplicate=False) if id(p) in rt.owner}

    def save(module: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
        for name, (g, i) in names.items():
            rt.wait_updates(g)
            if prefix + name in state:
                view = g.master[g.slot(i)].view(g.params[i].shape)
                state[prefix + name] = view if rt.lend_views else view.clone()

    def load(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        with torch.no_grad():
            for name, (g, i) in names.items():
                value = state.pop(prefix + name, None)
                if value is None:
                    continue
                rt.wait_updates(g)
                rt.guard_writes([g.master])
                sl = g.slot(i)
                g.master[sl].copy_(value.reshape(-1))
                if g.host_copy is not None and g.host_copy is not g.master:
                    g.host_copy[sl].copy_(g.master[sl])
                g.stale = True

    def loaded(module: nn.Module, incompatible: Any) -> None:
        incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in names]

    model.register_state_dict_post_hook(save)
    model.register_load_state_dict_pre_hook(load)
    model.register_load_state_dict_post_hook(loaded)
