"""The gradient path of the offload runtime: from each parameter's gradient to the CPU optimizer.

Each parameter's post-accumulate-grad hook copies its gradient to the host (or adds it
to the block's device accumulator, planned for gradient accumulation) and drops it from the
device. By default (``grad_fold``) the gradient is converted to float32 on the device and
copied straight into the block's float32 host gradient, so the CPU does no fold pass; where one
micro-batch makes the step's gradient and the block's update is one flat fused call with nothing
between (no clipping), it goes in the compute dtype instead (half the bytes over PCIe and through
host memory) and the update upcasts it chunk by chunk (exact, so the same bits); with
``grad_fold="host"``, or when a micro-batch is added to gradients already on the host, it
lands in host staging in the compute dtype and the CPU worker folds it in. When a block's
last gradient is in and the update is exact (last micro-batch, no clipping), the CPU worker
updates the block's master weights at once while backward continues (Ratel's active
gradient offloading).
:class:`GradientPath` is the part of :class:`~carina.offload.runtime.OffloadRuntime` that does
this; the runtime owns the state it reads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from carina.memory.tiers import Tier
from carina.offload.blocks import ParamGroup
from carina.offload.config import OverlapMode
from carina.offload.flatstep import UPCAST_CHUNK

if TYPE_CHECKING:
    from collections.abc import Callable

    from carina.memory.store import TensorStore
    from carina.offload.activations import ActivationManager
    from carina.offload.blocks import HostBuffers
    from carina.offload.config import OffloadConfig
    from carina.offload.streams import Mover
    from carina.offload.timing import StepTimer
    from carina.offload.worker import PriorityWorker

__all__ = ["GradientPath"]


class GradientPath:
    """Gradient hooks, the CPU worker's fold-and-update task, and the device accumulators."""

    if TYPE_CHECKING:  # owned by OffloadRuntime
        cfg: OffloadConfig
        store: TensorStore
        mover: Mover
        worker: PriorityWorker
        timer: StepTimer | None
        acts: ActivationManager
        owner: dict[int, tuple[ParamGroup, int]]
        blocks: list[ParamGroup]
        host: HostBuffers
        fold_on_device: bool
        profiling: bool
        micro: int
        step_group: Any
        snapshot: Any
        may_take: Any
        narrow_ok: Callable[[ParamGroup], bool]  # the optimizer's: can g's update read a compute-dtype gradient

        def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
            """The runtime's step-timer phase."""

        def wait_updates(self, g: ParamGroup) -> None:
            """The runtime's wait for ``g``'s queued CPU work."""

        def _release(self, g: ParamGroup) -> None: ...

    def _grad_hook(self, p: torch.Tensor) -> None:
        with self.phase("grad_offload"):
            self._offload_grad(p)

    def _offload_grad(self, p: torch.Tensor) -> None:
        g, i = self.owner[id(p)]
        grad = p.grad
        p.grad = None
        assert grad is not None
        if g.grads_seen == 0:
            g.grad_mode = self._grad_mode(g)
            if g.pending:
                with self.phase("optim_wait"):
                    self.wait_updates(g)  # the staging buffer (and the host gradient) are free again
            if g.has_grad:  # this micro-batch adds to a gradient on the host: it must be float32
                g.widen_grad(UPCAST_CHUNK)
            self.mover.wait_on_compute(g.acc_event)  # the accumulator's last shipment has left
            g.acc_event = None
            g.events = []
            g.direct = g.grad_mode == "host" and self.fold_on_device and not g.has_grad
            g.narrow = g.direct and self.narrow_ok(g)  # the update reads the compute dtype itself
            if g.grad_mode == "host" and not g.direct:
                self.host.add_staging(g)  # made at wrap where planned; late only for unplanned micro-batches
        flat = grad.reshape(-1)
        if g.narrow:  # as computed (an exact upcast in the update follows): half the bytes of float32
            g.events.append(self.mover.to_host(g.narrow_grad[g.slot(i)], flat))
            self.store.note_move(Tier.DEVICE, Tier.HOST, flat.numel() * flat.element_size())
        elif g.direct:  # folded on the device: float32 straight into the host gradient, no CPU pass
            wide = flat.float()
            g.events.append(self.mover.to_host(g.grad[g.slot(i)], wide))
            self.store.note_move(Tier.DEVICE, Tier.HOST, wide.numel() * wide.element_size())
        elif g.grad_mode == "host":
            assert g.staging is not None
            g.events.append(self.mover.to_host(g.staging[g.slot(i)], flat))
            self.store.note_move(Tier.DEVICE, Tier.HOST, grad.numel() * grad.element_size())
        else:
            assert g.acc is not None
            acc = g.acc[g.slot(i)]
            if g.acc_count == 0:
                acc.copy_(flat)  # exactly what the host path does with the first micro-batch
            else:
                acc.add_(flat)
            if g.grad_mode == "ship":
                g.events.append(self.mover.to_host(g.grad[g.slot(i)], acc))
                self.store.note_move(Tier.DEVICE, Tier.HOST, acc.numel() * acc.element_size())
        g.grads_seen += 1
        if g.grads_seen == len(g.params):
            self._grads_done(g)

    def _grad_mode(self, g: ParamGroup) -> str:
        """Where this backward's gradients of ``g`` go: host staging, the device accumulator, or out of it."""
        if g.acc is None or g.has_grad:
            return "host"
        return "ship" if self.micro % self.cfg.grad_accumulation == 0 else "acc"

    def overlap_now(self) -> bool:
        """Whether a block may be updated during this backward (exact and allowed)."""
        mode = self.cfg.overlap
        if self.profiling or mode is OverlapMode.STEP or self.step_group is None:
            return False
        if mode is OverlapMode.AUTO and self.cfg.max_grad_norm is not None:
            return False
        return self.micro % self.cfg.grad_accumulation == 0

    def _grads_done(self, g: ParamGroup) -> None:
        events, g.events, g.grads_seen = g.events, [], 0
        if g.grad_mode == "acc":
            g.acc_count += 1  # nothing leaves the device until the last micro-batch
        else:
            if g.grad_mode == "ship":
                how, g.acc_count = "none", 0
                g.acc_event = events[-1] if events else None  # the D2H stream runs in order
            else:
                how = "none" if g.direct else "add" if g.has_grad else "copy"
            g.has_grad = True
            eager = self.overlap_now()
            # hyperparameters as they are now: a block's update may still run after step() returned
            options = self.snapshot(g) if eager else None
            first = g.index if g.module is not None else -1  # the order the next forward needs them
            ready = partial(self.mover.all_done, events)
            if eager and self.may_take is not None:  # a spilled block waits while another's state is read ahead
                ready = partial(_both, ready, partial(self.may_take, g.index))
            fut = self.worker.submit(
                self._consume, g, events, how, eager, options, priority=first if eager else -2, ready=ready
            )
            g.pending.append(fut)
            if eager:
                g.updates.append(fut)
                g.queued = True
                g.detached = options is not None and not self.cfg.step_barrier
        if g.module is not None:
            if not g.resident:
                self._release(g)
            self.acts.block_done(g.index)

    def _consume(self, g: ParamGroup, events: list[Any], how: str, eager: bool, options: Any) -> None:
        timer = self.timer
        t0 = time.perf_counter()
        for event in events:
            self.mover.wait_on_host(event)
        t1 = time.perf_counter()
        if how == "add":
            assert g.staging is not None
            g.grad.add_(g.staging)
        elif how == "copy":
            assert g.staging is not None
            g.grad.copy_(g.staging)
        if timer is not None:
            timer.add("optim_d2h_wait_s", t1 - t0)
            timer.add("optim_fold_s", time.perf_counter() - t1)
        if eager:
            self.step_group(g, options)

    def flush_accumulator(self, g: ParamGroup) -> None:
        """Ship a device accumulator that still holds micro-batches (a step came early) to the host."""
        if g.acc is None or not g.acc_count:
            return
        self.mover.wait_on_compute(g.acc_event)
        g.grad.copy_(g.acc)  # a blocking copy after the compute stream's adds
        self.store.note_move(Tier.DEVICE, Tier.HOST, g.acc.numel() * g.acc.element_size())
        g.acc_count, g.acc_event, g.has_grad = 0, None, True

    def discard_accumulators(self) -> None:
        """Forget gradients summed on the device (``zero_grad``)."""
        for g in self.blocks:
            g.acc_count = 0


def _both(first: Callable[[], bool], second: Callable[[], bool]) -> bool:
    """``first() and second()``, as one ``ready`` callable for the worker."""
    return first() and second()
