"""Resident mode: a model whose whole training state fits the device trains as plain PyTorch would.

When the plan's mode is :attr:`~carina.offload.planner.PlanMode.RESIDENT` (see
:func:`~carina.offload.planner.resident_plan`), :func:`carina.offload.wrap` moves the model to
the device and hands back a :class:`ResidentOptimizer`: the user's optimizer class, param groups
and hyperparameters (fused/foreach as the user chose them) stepping on the device. There are no
module or saved-tensor hooks, no host masters, no pinned slabs, no CPU worker.

With float32 compute the parameters are the masters: training is plain PyTorch, bit for bit.
With a narrower compute dtype (``compute_dtype="bfloat16"``) the model's parameters become that
dtype on the device, as they do when offloaded, and float32 masters live beside them on the
device: the optimizer steps the masters and each step ends by casting them into the parameters.
Gradients reach the masters as float32: at ``step()`` when one backward makes a step, through a
post-accumulate-grad hook per parameter (an add into the float32 gradient, the compute-dtype one
freed) when ``grad_accumulation > 1``, so micro-batches add in float32 as they do when offloaded.
``model.state_dict()`` then gives the float32 masters, as an offloaded model's does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from carina.core.errors import ConfigError
from carina.memory.store import TensorStore
from carina.memory.tiers import Tier
from carina.offload.config import OffloadConfig
from carina.offload.planner import Plan
from carina.offload.profiler import optimizer_kwargs

__all__ = ["ResidentOptimizer", "ResidentRuntime"]

log = logging.getLogger("carina.offload")


class ResidentRuntime:
    """A resident model: its parameters on the device, float32 masters where the compute dtype is narrower.

    Args:
        model: The model (moved to ``store.device``).
        cfg: The offload config.
        store: The ledger (the device bytes are charged to it).
        compute_dtype: Dtype of the device parameters (None: each parameter's own).
    """

    timer = None  # no step timing in resident mode (nothing is moved or waited for)
    pinned_bytes = 0

    def __init__(self, model: nn.Module, cfg: OffloadConfig, store: TensorStore, compute_dtype: torch.dtype | None):
        self.model, self.cfg, self.store = model, cfg, store
        self.device = store.device
        self.params = _trainable(model)
        self.masters: list[torch.Tensor] = []  # float32, one per parameter (the parameter itself when float32)
        self._handles: list[Any] = []
        with torch.no_grad():
            for p in self.params:
                dtype = compute_dtype or p.dtype
                if dtype == torch.float32 or not dtype.is_floating_point:
                    p.data = p.data.to(self.device, dtype)
                    self.masters.append(p)
                    continue
                master = p.detach().to(self.device, torch.float32, copy=True)
                p.data = master.to(dtype)
                self.masters.append(master)
            model.to(self.device)  # frozen parameters and buffers
        self.mixed = [(p, m) for p, m in zip(self.params, self.masters, strict=True) if m is not p]
        if self.mixed and cfg.grad_accumulation > 1:
            for p, m in self.mixed:
                self._handles.append(p.register_post_accumulate_grad_hook(_add_into(m)))
        nbytes = sum(t.numel() * t.element_size() for p, m in zip(self.params, self.masters, strict=True)
                     for t in ((p,) if m is p else (p, m)))  # fmt: skip
        store.charge(Tier.DEVICE, nbytes, "resident parameters and float32 masters")
        if self.mixed:
            self._install_state_hooks()

    def fold(self) -> None:
        """Bring the compute-dtype gradients into the float32 masters' (one backward per step)."""
        for p, m in self.mixed:
            if p.grad is not None:
                if m.grad is None:
                    m.grad = p.grad.to(torch.float32)
                else:
                    m.grad.add_(p.grad)
                p.grad = None

    @torch.no_grad()
    def cast(self) -> None:
        """Cast the updated float32 masters into the compute-dtype parameters."""
        if self.mixed:
            torch._foreach_copy_([p.data for p, _ in self.mixed], [m for _, m in self.mixed])

    def drain(self, keep_detached: bool = False) -> None:
        """Nothing to wait for (the optimizer steps on the device, in stream order)."""

    def wait_updates(self, g: Any) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Remove carina's hooks (the model stays on the device)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _install_state_hooks(self) -> None:
        """``model.state_dict()`` gives the float32 masters; ``load_state_dict`` writes them (and casts)."""
        masters = {id(p): m for p, m in self.mixed}
        names = {n: masters[id(p)] for n, p in self.model.named_parameters(remove_duplicate=False) if id(p) in masters}
        params = {n: p for n, p in self.model.named_parameters(remove_duplicate=False) if id(p) in masters}

        def save(module: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
            for name, m in names.items():
                if prefix + name in state:
                    state[prefix + name] = m.detach()

        def load(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
            with torch.no_grad():
                for name, m in names.items():
                    value = state.pop(prefix + name, None)
                    if value is not None:
                        m.copy_(value.reshape(m.shape))
                        params[name].copy_(m)

        def loaded(module: nn.Module, incompatible: Any) -> None:
            incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in names]

        self._handles.append(self.model.register_state_dict_post_hook(save))
        self._handles.append(self.model.register_load_state_dict_pre_hook(load))
        self._handles.append(self.model.register_load_state_dict_post_hook(loaded))


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _add_into(master: torch.Tensor) -> Callable[[torch.Tensor], None]:
    def hook(p: torch.Tensor) -> None:
        assert p.grad is not None
        if master.grad is None:
            master.grad = p.grad.to(torch.float32)
        else:
            master.grad.add_(p.grad)
        p.grad = None

    return hook


class ResidentOptimizer(torch.optim.Optimizer):
    """The user's optimizer on the device: same class, param groups and hyperparameters.

    It shares its param groups and state with an inner optimizer of the user's class over the
    device masters (LR schedulers and ``state_dict()``/``load_state_dict()`` work as usual; the
    state dict is the inner one's, interchangeable with an offloaded run's). ``step()`` clips
    (``Config(max_grad_norm=...)``) over every gradient, steps and casts.

    Args:
        user: The optimizer the user built over the model's parameters (no state yet).
        runtime: The resident runtime.
        plan: The resident plan.
    """

    hardware = None  # no rates measured: nothing is moved

    def __init__(self, user: torch.optim.Optimizer, runtime: ResidentRuntime, plan: Plan) -> None:
        if user.state:
            raise ConfigError("wrap the optimizer before its first step (it already has state)", key="optimizer")
        self.rt, self.cfg, self.plan = runtime, runtime.cfg, plan
        master_of = {id(p): m for p, m in zip(runtime.params, runtime.masters, strict=True)}
        groups = []
        for group in user.param_groups:
            if any(id(p) not in master_of for p in group["params"]):
                raise ConfigError("the optimizer holds parameters that are not the model's", key="optimizer")
            groups.append({**group, "params": [master_of[id(p)] for p in group["params"]]})
        self.inner = type(user)(groups, **optimizer_kwargs(user))
        super().__init__([dict(g) for g in self.inner.param_groups], self.inner.defaults)
        self._share()
        self.masters = runtime.masters
        self.steps = 0
        self._charged = False

    def _share(self) -> None:
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Clip (when configured), step the user's optimizer on the device, cast into the compute dtype."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.rt.fold()
        if self.cfg.max_grad_norm is not None:
            grads = [m for m in self.masters if m.grad is not None]
            if grads:
                torch.nn.utils.clip_grad_norm_(grads, self.cfg.max_grad_norm)
        self.inner.step()
        self.rt.cast()
        if not self._charged:
            self._charged = True
            nbytes = sum(t.numel() * t.element_size() for s in self.inner.state.values() for t in s.values()
                         if isinstance(t, torch.Tensor) and t.device == self.rt.device)  # fmt: skip
            self.rt.store.charge(Tier.DEVICE, nbytes, "resident optimizer state")
        self.steps += 1
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (the masters' and the compute-dtype parameters')."""
        self.inner.zero_grad(set_to_none)
        for p, _ in self.rt.mixed:
            if p.grad is not None:
                p.grad = None

    def synchronize(self) -> None:
        """Wait for the device (the updates are queued on its stream)."""
        if self.rt.device.type == "cuda":
            torch.cuda.synchronize(self.rt.device)

    def make_plan(self) -> Plan:
        """The plan in force (made before wrapping; nothing is profiled)."""
        return self.plan

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict (its state on the device)."""
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state (from this mode or an offloaded run's ``state_dict()``); it moves to the device."""
        self.inner.load_state_dict(state_dict)
        self._share()
