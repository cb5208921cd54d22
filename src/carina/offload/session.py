"""The optimizer side of offloaded training: CPU updates, clipping, profiling, planning.

:class:`OffloadOptimizer` is what :func:`carina.offload.wrap` hands back in
place of the user's optimizer. It is a real ``torch.optim.Optimizer`` (LR
schedulers work, ``state_dict`` round-trips) whose parameters are the float32
master weights in host RAM; an inner optimizer of the user's class and
hyperparameters updates them one block at a time, on the runtime's CPU worker
during backward or at ``step()``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from carina.core.errors import ConfigError
from carina.memory.tiers import Tier
from carina.offload import profiler
from carina.offload.blocks import ParamGroup
from carina.offload.config import OffloadConfig
from carina.offload.flatstep import UPCAST_CHUNK, FlatStep
from carina.offload.lending import StateLending
from carina.offload.planner import Plan, PlanBudgets, make_plan
from carina.offload.profiler import measure_hardware, model_profile, optimizer_kwargs, state_bytes_per_param
from carina.offload.runtime import OffloadRuntime
from carina.offload.simulator import BlockPlan, Hardware, ModelProfile, simulate
from carina.offload.spill import SpillPipeline

__all__ = ["OffloadOptimizer"]

log = logging.getLogger("carina.offload")


class OffloadOptimizer(StateLending, torch.optim.Optimizer):
    """The user's optimizer, run on the CPU over float32 master weights.

    Args:
        user: The optimizer the user built over the model's parameters (its class
            and per-group hyperparameters are reused; it must have no state yet).
        runtime: The wrapped model's runtime.
        budgets: Budgets the plan must respect.
        on_plan: Called with each plan when it is made.
    """

    def __init__(
        self,
        user: torch.optim.Optimizer,
        runtime: OffloadRuntime,
        budgets: PlanBudgets,
        on_plan: Callable[[Plan], None] | None = None,
    ) -> None:
        if user.state:
            raise ConfigError("wrap the optimizer before its first step (it already has state)", key="optimizer")
        self.rt = runtime
        self.cfg: OffloadConfig = runtime.cfg
        self.budgets = budgets
        self.on_plan = on_plan
        master_of = {id(p): g.masters[i] for g in runtime.groups for i, p in enumerate(g.params)}
        kwargs = profiler.inner_kwargs(user, self.cfg, runtime.device)
        given = optimizer_kwargs(user)
        # the implementation carina chose must reach every group: a group's own "fused": None wins over defaults
        chosen: dict[str, Any] = {
            k: kwargs[k] for k in ("fused", "foreach") if k in kwargs and kwargs[k] != given.get(k)
        }
        groups = []
        for group in user.param_groups:
            missing = [p for p in group["params"] if id(p) not in master_of]
            if missing:
                raise ConfigError("the optimizer holds parameters that are not the model's", key="optimizer")
            groups.append({**group, **chosen, "params": [master_of[id(p)] for p in group["params"]]})
        self.inner = type(user)(groups, **kwargs)
        super().__init__([dict(g) for g in self.inner.param_groups], self.inner.defaults)
        self._share()
        self.masters = [master_of[id(p)] for p in runtime.model.parameters() if id(p) in master_of]
        self.state_bytes = state_bytes_per_param(user)
        self.state_scalars = profiler.state_scalar_bytes(self.inner)  # per tensor beside those: the step counts
        self.hardware: Hardware | None = None
        self.plan: Plan | None = None
        self.profile: ModelProfile | None = None  # what the last plan was made from
        self.steps = 0
        self._charged: set[int] = set()
        self.spill: set[int] = set()  # blocks whose optimizer state lives on NVMe between updates
        self._todo: set[int] = set()  # blocks step() updates now (the spill pipeline reads them ahead)
        self.spill_pipe = SpillPipeline(runtime.store, self.inner, runtime.groups, self._due, lambda: runtime.timer)
        self.flat_updates = True  # fused optimizers step each block as one flat tensor (FlatStep)
        self._flat: dict[int, FlatStep | None] = {}
        self.narrow_grads = self.cfg.narrow_grads  # one micro-batch, no clipping: flat updates read the narrow gradient
        runtime.step_group = self.step_group
        runtime.snapshot = self.snapshot
        runtime.may_take = self.spill_pipe.may_take
        runtime.narrow_ok = self.narrow_ok
        runtime.on_forward = self._forward_starts

    def _share(self) -> None:
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state

    # -- updates -------------------------------------------------------------------------------
    def _attach_grads(self, g: ParamGroup) -> None:
        for i, mp in enumerate(g.masters):
            mp.grad = g.grad[g.slot(i)].view(mp.shape)

    def snapshot(self, g: ParamGroup) -> dict[str, Any] | None:
        """``g``'s hyperparameters now, for an update that may run after ``step()`` returned (else None).

        Only blocks stepped by one flat call can: their private optimizer takes the copy, so an LR
        scheduler stepped meanwhile changes nothing. The others are waited for at ``step()``.
        """
        flat = self._flat_step(g)
        return flat.hyperparameters() if flat is not None else None

    def narrows(self) -> bool:
        """Whether gradients may cross in the compute dtype: one micro-batch, no clipping, flat updates."""
        cfg = self.cfg
        plain = cfg.grad_accumulation == 1 and cfg.max_grad_norm is None and self.flat_updates and self.narrow_grads
        return plain and self.rt.rest.device.dtype != torch.float32

    def narrow_ok(self, g: ParamGroup) -> bool:
        """Whether ``g``'s next update reads a compute-dtype gradient (:meth:`FlatStep.step`, with its state)."""
        flat = self._flat_step(g) if self.narrows() else None
        return flat is not None and flat.ready

    def step_group(self, g: ParamGroup, options: dict[str, Any] | None = None) -> None:
        """Update ``g``'s master weights from its float32 gradients (runs on any thread, one at a time).

        ``options``: the hyperparameters to use (a :meth:`snapshot`); None: the param group's now. A block
        whose state spills goes through the spill pipeline (:mod:`carina.offload.spill`), tensor by tensor.
        """
        if self.rt.write_guards:
            self.rt.guard_writes(self._written_by(g))
        timer = self.rt.timer
        t0 = time.perf_counter()
        flat = self._flat_step(g)
        if g.index in self.spill:
            self._flat.pop(g.index, None)  # a flat state from before it spilled would keep its host bytes alive
            g.widen_grad(UPCAST_CHUNK)  # (a block whose state went to NVMe since its gradient came narrow)
            self.spill_pipe.update(g, lambda k: self._step_tensor(g, k), lambda: self._charge_state(g))
            t0 = time.perf_counter()
        elif flat is not None:
            flat.step(options)
        else:
            g.widen_grad(UPCAST_CHUNK)
            self._attach_grads(g)
            try:
                self.inner.step()
            finally:
                for mp in g.masters:
                    mp.grad = None
        t1 = time.perf_counter()
        g.refresh_copy()  # the cast into the compute-dtype host copy (none when the device casts)
        if timer is not None:
            timer.add("optim_update_s", t1 - t0)  # (a spilled block's update is timed by the pipeline)
            timer.add("optim_cast_s", time.perf_counter() - t1)
            timer.add("optim_params", g.numel)
        g.stale = True
        self._charge_state(g)

    def _step_tensor(self, g: ParamGroup, k: int) -> None:
        """Update master ``k`` of ``g`` alone (a spilled block's update, one tensor at a time)."""
        mp = g.masters[k]
        mp.grad = g.grad[g.slot(k)].view(mp.shape)
        try:
            self.inner.step()
        finally:
            mp.grad = None

    def _charge_state(self, g: ParamGroup) -> None:
        """Charge ``g``'s optimizer state to the host ledger the first time the optimizer made it."""
        if g.index in self._charged:
            return
        self._charged.add(g.index)
        nbytes = sum(
            t.numel() * t.element_size()
            for mp in g.masters
            for t in self.inner.state.get(mp, {}).values()
            if isinstance(t, torch.Tensor)
        )
        self.rt.store.charge(Tier.HOST, nbytes, f"{g.name} optimizer state")

    def _due(self) -> list[int]:
        """Spilled blocks whose update is queued this step, in the order the worker takes them (by index)."""
        return [g.index for g in self.rt.blocks if g.index in self.spill and (g.queued or g.index in self._todo)]

    def _forward_starts(self, micro: int) -> None:
        if micro == 1 and self.spill:  # updates during backward come last block first, at step() first first
            self.spill_pipe.forward_starts(descending=not self.rt.profiling and self._will_overlap())

    def _flat_step(self, g: ParamGroup) -> FlatStep | None:
        """The block's one-kernel update (:mod:`carina.offload.flatstep`), where it applies."""
        if not self.flat_updates or g.index in self.spill:
            return None
        if g.index not in self._flat:
            self._flat[g.index] = FlatStep.for_group(self.inner, g)
        return self._flat[g.index]

    def _clip(self, groups: list[ParamGroup]) -> None:
        assert self.cfg.max_grad_norm is not None
        for g in groups:
            self._attach_grads(g)
        with_grad = [mp for mp in self.masters if mp.grad is not None]
        torch.nn.utils.clip_grad_norm_(with_grad, self.cfg.max_grad_norm)
        for mp in with_grad:
            mp.grad = None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Finish the step: wait for overlapped updates, clip, update the rest, plan after profiling."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rt = self.rt
        if rt.timer is not None:
            rt.timer.switch("step")
        try:
            new_plan = self._finish_updates()
            self.spill_pipe.settle()  # spilled blocks' write-backs end within the step (reads go on ahead)
            if self.spill_pipe.error is not None:
                raise self.spill_pipe.error
        finally:  # a failed update ends the step too: its gradients are dropped, the next step starts clean
            for g in rt.groups:
                g.queued = False
                g.has_grad = False
            self.spill_pipe.end_step()
            rt.micro = 0
        self.steps += 1
        if rt.profiling and new_plan is None:
            rt.reset_timings()  # only the last profiled step's times count (the first pays warm-up)
        if new_plan is not None:
            rt.apply(
                [b.activation for b in new_plan.blocks],
                [b.resident for b in new_plan.blocks],
                [b.grad_on_device for b in new_plan.blocks],
                [not b.cast_on_device for b in new_plan.blocks],
                act_lead=new_plan.act_lead,
            )
        if rt.timer is not None:
            rt.timer.end_step()
        return loss

    def _finish_updates(self) -> Plan | None:
        """Wait for the updates queued in backward, plan after profiling, clip and update the rest; the new plan."""
        rt = self.rt
        rt.drain(keep_detached=True)  # blocks' updates queued in backward may go on into the next forward
        new_plan = None
        if rt.profiling:  # before any update makes optimizer state: the swaps' pinned blocks go back to the OS
            rt.release_pinned_cache()
        if rt.profiling and self.steps + 1 >= self.cfg.profile_steps:
            new_plan = self.make_plan()
        elif rt.profiling and self.steps == 0:
            self.make_plan()  # activation sizes are known now: raises CapacityError before any update
        todo = [g for g in rt.groups if g.has_grad and not g.queued]
        if self.cfg.max_grad_norm is not None and todo:
            self._clip(todo)
        self._todo = {g.index for g in todo}
        try:
            for g in todo:
                self.step_group(g)
        finally:
            self._todo = set()
        return new_plan

    def synchronize(self) -> None:
        """Wait until every queued update is done (``step()`` may return before the last blocks' are).

        ``model.state_dict()``, ``state_dict()`` and each block's next use wait on their own; call this
        before reading the masters in another way (``optimizer.masters``, the param groups' tensors).
        """
        for g in self.rt.groups:
            self.rt.wait_updates(g)
        self.spill_pipe.settle()
        if self.spill_pipe.error is not None:
            raise self.spill_pipe.error

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget accumulated gradients (``step()`` already consumes them)."""
        for g in self.rt.groups:
            if not g.detached:  # (a detached update consumes this step's gradient and touches nothing else)
                self.rt.wait_updates(g)
            g.has_grad = False
        self.rt.discard_accumulators()

    # -- planning ------------------------------------------------------------------------------
    def make_plan(self) -> Plan:
        """Plan from what profiling recorded; raises CapacityError when nothing fits."""
        rt = self.rt
        if self.hardware is None:
            largest = max((g.numel for g in rt.blocks), default=1 << 20)
            self.hardware = measure_hardware(
                rt.device,
                self.cfg,
                self.inner,
                block_numel=largest,
                threads=rt.optim_threads,
                compute_dtype=rt.rest.device.dtype,
                host_room=self._host_room(),
            )
        count = max(1, rt.fwd_count)
        prof = model_profile(
            rt.blocks,
            rt.rest,
            other_act_bytes=rt.other_act_bytes,
            other_fwd_s=(rt.fwd_total - sum(g.fwd_s for g in rt.blocks)) / count,
            state_bytes=self.state_bytes,
            state_scalars=self.state_scalars,
            steps=count,
            micro_batches=self.cfg.grad_accumulation if self.cfg.accumulate_on_device else 1,
            fold_on_device=rt.fold_on_device,
            narrow_grads=rt.fold_on_device and self.narrows() and self._flat_step(rt.rest) is not None,
            staging=any(g.staging is not None for g in rt.groups),
            rest_cast_on_device=rt.rest.host_copy is None,
        )
        prof = replace(
            prof,
            head_workspace_bytes=rt.head.workspace(self._profiled_head(prof)),
            host_fixed_bytes=rt.host.slack_bytes,  # pinned, though no buffer uses it: the plan counts it
        )
        self.profile = prof
        budgets = self.budgets
        if budgets.device is not None:  # the cast-on-device buffer is carina's, outside the plan
            budgets = replace(budgets, device=budgets.device - rt.fixed_device_bytes)
        plan = make_plan(
            prof,
            budgets,
            self.hardware,
            policy=self.cfg.activations.value,
            prefetch_depth=self.cfg.prefetch_depth,
            overlap=self._will_overlap(),
            cast=self.cfg.param_cast.value,
            carry=not self.cfg.step_barrier,
            act_lead=self.cfg.activation_lead,
        )
        self.plan = plan
        # a block whose state is on NVMe stays spilled (less host RAM than planned, never more)
        self.spill = {i for i, b in enumerate(plan.blocks) if b.state_on_nvme} | set(self.spill_pipe.spilled)
        log.info("offload plan: %s", plan.summary())
        if self.on_plan is not None:
            self.on_plan(plan)
        return plan

    def _host_room(self) -> int | None:
        """Host bytes left in the budget now: the ledger's, less the spill slot's buffer (charged only while in use)."""
        if self.budgets.host is None:
            return None
        buf = self.spill_pipe.buffer
        return self.budgets.host - self.rt.store.used(Tier.HOST) - (int(buf.numel()) if buf is not None else 0)

    def _profiled_head(self, prof: ModelProfile) -> int:
        """Device bytes the simulator puts at the head under the profiling plan (the measured one)."""
        blocks = tuple(BlockPlan(activation=a) for a in self.rt.actions)
        assert self.hardware is not None
        events, _ = simulate(blocks, prof, self.hardware, self.cfg.prefetch_depth)
        return max(e.device_bytes for e in events if e.kind == "head")

    def _will_overlap(self) -> bool:
        from carina.offload.config import OverlapMode

        mode = self.cfg.overlap
        return mode is OverlapMode.BACKWARD or (mode is OverlapMode.AUTO and self.cfg.max_grad_norm is None)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state; state spilled to NVMe is read into fresh tensors for the caller."""
        for g in self.rt.groups:
            self.rt.wait_updates(g)
        self.spill_pipe.settle()
        sd = self.inner.state_dict()
        index = {id(p): k for k, p in enumerate(p for group in self.inner.param_groups for p in group["params"])}
        for mp, name, t in self.spill_pipe.read_out():
            k = index[id(mp)]
            sd["state"][k] = {**sd["state"][k], name: t}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state (as saved by :meth:`state_dict`); spilled blocks go back to NVMe."""
        for g in self.rt.groups:
            self.rt.wait_updates(g)
            if self.rt.write_guards:
                self.rt.guard_writes(self._written_by(g))
        self.spill_pipe.settle(discard=True)
        self.spill_pipe.forget()
        self._flat.clear()  # rebuilt from the loaded per-parameter state at the next update
        self.inner.load_state_dict(state_dict)
        self._share()
        for g in self.rt.groups:
            if g.index in self.spill and g.index in self._charged:
                self.spill_pipe.write_now(g, uncharge=False)
