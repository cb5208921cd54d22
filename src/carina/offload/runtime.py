"""The offload runtime: module hooks that stream parameters and gradients.

The gradient half lives in :mod:`carina.offload.gradients` (:class:`GradientPath`, a base of the runtime).

Per block, a forward pre-hook makes its parameters resident and prefetches
the next ``prefetch_depth`` blocks; a forward hook frees them again. In
backward, the first saved tensor of a block that autograd unpacks makes it
resident and prefetches the blocks below. Each parameter's
post-accumulate-grad hook copies its gradient to host staging and drops it
from the device; when a block's last gradient is in, the block's device
storage is freed and a CPU worker folds the staging into the float32
gradient and, when the update is exact (last micro-batch, no clipping),
updates that block's master weights at once while backward continues
(Ratel's active gradient offloading). No torch function is patched: blocks
whose activations are recomputed get an instance-level ``forward`` that runs
the original under ``torch.utils.checkpoint``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import torch
from torch import nn

from carina.memory.batch import wait_all
from carina.memory.store import TensorStore
from carina.memory.tiers import Tier
from carina.offload.activations import ActivationManager
from carina.offload.blocks import (
    HostLayout,
    ParamGroup,
    build_groups,
    partition,
    release_device,
    restore_device,
)
from carina.offload.config import ConvertOn, OffloadConfig
from carina.offload.gradients import GradientPath
from carina.offload.simulator import Action
from carina.offload.timing import StepTimer
from carina.offload.worker import optimizer_threads, optimizer_worker
from carina.offload.workspace import HeadWorkspace

__all__ = ["OffloadRuntime", "cast_buffer_elements"]

_NO_PHASE = contextlib.nullcontext()


def cast_buffer_elements(room: int | None, chunk: int) -> int:
    """Float32 elements of the cast-on-device buffer: ``chunk``, or a 16th of ``room`` bytes if smaller (>= 1024)."""
    return chunk if room is None else max(1 << 10, min(chunk, max(0, room) // 64))


class OffloadRuntime(GradientPath):
    """Owns a wrapped model's parameter groups, hooks, copies and CPU worker.

    Args:
        model: The model; its parameters are moved into carina's buffers.
        blocks: ``(name, module)`` of the repeated blocks, in execution order.
        cfg: The offload config.
        store: The ledger and allocator of every tier.
        compute_dtype: Dtype of the device parameters (None: each group's own).
    """

    def __init__(
        self,
        model: nn.Module,
        blocks: list[tuple[str, nn.Module]],
        cfg: OffloadConfig,
        store: TensorStore,
        compute_dtype: torch.dtype | None,
    ) -> None:
        from carina.offload.streams import Mover

        self.model, self.cfg, self.store = model, cfg, store
        self.device = store.device
        self.mover = Mover(self.device)
        self.head = HeadWorkspace(self.device)  # before carina allocates anything on the device
        self.timer = StepTimer(self.device) if cfg.step_timing else None
        self.optim_threads = optimizer_threads(cfg, self.device)
        self.worker = optimizer_worker(self.optim_threads)
        self.fold_on_device = cfg.grad_fold is not ConvertOn.HOST
        layout = HostLayout(
            staging=not self.fold_on_device or cfg.grad_accumulation > 1,
            host_copy=cfg.param_cast is ConvertOn.HOST,
        )
        self.groups, self.host = build_groups(partition(model, blocks), store, compute_dtype, layout)
        self.fixed_device_bytes = self._cast_buffer()
        self.blocks = self.groups[:-1]
        self.rest = self.groups[-1]
        self.owner = {id(p): (g, i) for g in self.groups for i, p in enumerate(g.params)}
        self.storage_owner: dict[int, ParamGroup] = {}
        self._register_storage(self.rest)
        # While profiling, activations go to host RAM when device memory is the constraint.
        self.profile_swaps = cfg.device_budget is not None or self.device.type == "cuda"
        self.actions = [Action.SWAP if self.profile_swaps else Action.KEEP] * len(self.blocks)
        self.act_lead = 1  # blocks below whose swapped activations backward fetches ahead
        self.acts = ActivationManager(self)
        self.current: int | None = None
        self.in_forward = False
        self.profiling = True
        self.micro = 0
        self.fwd_total = 0.0
        self.fwd_count = 0
        self.other_act_bytes = 0
        self._entered: set[int] = set()
        self._t0 = 0.0
        self._fwd_wait = 0.0  # this forward's time making blocks' weights resident (not compute)
        self.step_group: Any = None  # set by the optimizer: fn(group, options) updating masters in place
        self.snapshot: Any = None  # set by the optimizer: fn(group) -> hyperparameters for a later update
        self.may_take: Any = None  # set by the optimizer: fn(group index) -> whether its update may start now
        self.narrow_ok: Any = lambda g: False  # set by the optimizer: fn(group) -> its update reads bf16 gradients
        self.on_forward: Any = lambda micro: None  # set by the optimizer: a training forward starts (micro-batch)
        self.write_guards: list[Any] = []  # fn(tensors): called before masters/optimizer state change in place
        self.lend_views = False  # model.state_dict() gives the masters themselves, not copies (a lender's save)
        self._handles: list[Any] = []
        self._install(model)

    @property
    def pinned_bytes(self) -> int:
        """Pinned host bytes held by the groups' slabs."""
        return self.host.pinned_bytes

    def _cast_buffer(self) -> int:
        """Make the device buffer that float32 masters pass through when cast on the device; its bytes."""
        if not any(g.host_copy is None for g in self.groups) or not self.mover.cuda:
            return 0
        # At most a 16th of what the device budget has left, so a small budget is not spent on the buffer (a
        # smaller one only means more, smaller copies; cast_to_device walks the buffer's size).
        budget = self.store.budgets.of(Tier.DEVICE)
        room = None if budget is None else budget - self.store.used(Tier.DEVICE)
        elems = cast_buffer_elements(room, self.mover.CAST_CHUNK)
        buf = self.store.empty((elems,), torch.float32, Tier.DEVICE, "cast-on-device buffer")
        self.mover.cast_buffer = buf
        return int(buf.numel() * buf.element_size())

    # -- hooks -----------------------------------------------------------------------------
    def _install(self, model: nn.Module) -> None:
        h = self._handles
        h.append(model.register_forward_pre_hook(self._model_pre))
        h.append(model.register_forward_hook(self._model_post, always_call=True))
        head_hook = self.head.hook(model)
        if head_hook is not None:
            h.append(head_hook)
        for g in self.blocks:
            assert g.module is not None
            h.append(g.module.register_forward_pre_hook(functools.partial(self._block_pre, g.index)))
            h.append(g.module.register_forward_hook(functools.partial(self._block_post, g.index), always_call=True))
            orig = g.module.forward
            g.module.forward = functools.partial(self._block_forward, g.index, orig)
        for g in self.groups:
            for p in g.params:
                h.append(p.register_post_accumulate_grad_hook(self._grad_hook))
        for p in model.parameters():
            if not p.requires_grad and p.device != self.device:
                p.data = p.data.to(self.device)  # frozen parameters simply live on the device
        for mod in model.modules():
            for name, buf in list(mod._buffers.items()):
                if buf is not None and buf.device != self.device:
                    mod._buffers[name] = buf.to(self.device)

    def _model_pre(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and module.training:
            self.micro += 1
            self.on_forward(self.micro)
        self.in_forward = True
        self._entered.clear()
        if self.timer is not None:
            self.timer.begin()
            self.timer.switch("outside")
        self.head.cancel()
        self._sync_if_profiling()
        self._t0 = time.perf_counter()
        self._fwd_wait = 0.0
        self.ensure(self.rest)
        self.acts.begin_forward()

    def _model_post(self, module: nn.Module, args: Any, out: Any) -> None:
        if self.profiling and self.in_forward:
            self._sync_if_profiling()
            self.fwd_total += time.perf_counter() - self._t0 - self._fwd_wait
            self.fwd_count += 1
            self.other_act_bytes = max(self.other_act_bytes, self.acts.other_bytes)
            self.head.note_output(out)
        self.acts.end_forward()
        self.in_forward = False
        self.current = None
        if self.timer is not None:
            self.timer.switch("outside")

    def _block_pre(self, i: int, module: nn.Module, args: Any) -> None:
        self.current = i
        if self.in_forward:
            self._sync_if_profiling()
            if self.profiling and self.profile_swaps:
                self.acts.profile_action(i)  # swap within the host allowance, else recompute
            t0 = time.perf_counter()
            with self.phase("h2d_wait"):
                self.ensure(self.blocks[i])
                for j in range(i + 1, min(len(self.blocks), i + 1 + self.cfg.prefetch_depth)):
                    self.prefetch(self.blocks[j], wait=False)
            self._sync_if_profiling()  # the weights are in: the block's time is its compute (the plan adds transfers)
            t1 = time.perf_counter()
            self._fwd_wait += t1 - t0
            self.blocks[i].fwd_s -= t1
            if self.timer is not None:
                self.timer.switch("forward")

    def _block_post(self, i: int, module: nn.Module, args: Any, out: Any) -> None:
        self.current = None
        self.acts.end_block(i)
        if not self.in_forward:
            return
        if self.timer is not None:
            self.timer.switch("outside")
        self._sync_if_profiling()
        self.blocks[i].fwd_s += time.perf_counter()
        g = self.blocks[i]
        if i < len(self.blocks) - 1 and not g.resident:
            self._release(g)
        elif i == len(self.blocks) - 1 and self.profiling and torch.is_grad_enabled():
            self.head.open()  # the head and the loss run until this block's backward

    def _block_forward(self, i: int, orig: Any, *args: Any, **kwargs: Any) -> Any:
        if self.actions[i] is Action.RECOMPUTE and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._recompute_body, i, orig, *args, use_reentrant=False, **kwargs)
        return orig(*args, **kwargs)

    def _recompute_body(self, i: int, orig: Any, *args: Any, **kwargs: Any) -> Any:
        if self.in_forward:
            return orig(*args, **kwargs)
        self.enter_backward(i)
        with self.phase("recompute"):
            return orig(*args, **kwargs)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The step timer's phase ``name`` for a with-block (nothing when timing is off)."""
        return self.timer.phase(name) if self.timer is not None else _NO_PHASE

    def _sync_if_profiling(self) -> None:
        if self.profiling and self.mover.cuda:  # the compute stream only: side-stream copies are not compute
            torch.cuda.current_stream(self.device).synchronize()

    # -- parameters --------------------------------------------------------------------------
    def _register_storage(self, g: ParamGroup) -> None:
        if g.device_bytes:
            self.storage_owner[g.device.untyped_storage().data_ptr()] = g

    def _release(self, g: ParamGroup) -> None:
        self.storage_owner.pop(g.device.untyped_storage().data_ptr(), None)
        release_device(g, self.store)

    def guard_writes(self, tensors: list[torch.Tensor]) -> None:
        """Call every write guard (a checkpoint still copying lent state) before ``tensors`` change in place."""
        for guard in self.write_guards:
            guard(tensors)

    def wait_updates(self, g: ParamGroup) -> None:
        """Block until the CPU worker finished everything queued for ``g`` (a failed task's error: here, once)."""
        pending, g.pending, g.updates, g.detached = g.pending, [], [], False
        wait_all(pending)

    def wait_params(self, g: ParamGroup) -> None:
        """Block until queued updates of ``g``'s master weights are done (gradient adds may go on)."""
        updates, g.updates, g.detached = g.updates, [], False
        wait_all(updates)

    def prefetch(self, g: ParamGroup, wait: bool = True) -> None:
        """Start copying ``g``'s (updated) parameters to the device, if they are not there.

        With ``wait=False`` (a look-ahead) nothing happens while ``g``'s update is still running:
        the block's own fetch waits for it instead of holding up the compute issued before.
        """
        if g.updates:
            if not wait and not all(f.done() for f in g.updates):
                return
            with self.phase("optim_wait"):
                self.wait_params(g)
        if g.on_device and not g.stale:
            return
        restore_device(g, self.store)
        self._register_storage(g)
        g.stale = False
        feed = g.feed
        g.fetch_event = self.mover.to_device(g.device, feed)
        self.store.note_move(Tier.HOST, Tier.DEVICE, feed.numel() * feed.element_size())

    def ensure(self, g: ParamGroup) -> None:
        """Make ``g``'s parameters usable by the next compute-stream work."""
        self.prefetch(g)
        self.mover.wait_on_compute(g.fetch_event)
        g.fetch_event = None

    def enter_backward(self, i: int) -> None:
        """Backward reached block ``i``: make it resident, prefetch the blocks below."""
        if i in self._entered or i >= len(self.blocks):
            if i >= len(self.blocks):
                self.ensure(self.groups[i])
            return
        self._entered.add(i)
        if i == len(self.blocks) - 1:
            self.head.close()
        with self.phase("h2d_wait"):
            self.ensure(self.blocks[i])
            for j in range(max(0, i - self.cfg.prefetch_depth), i):
                self.prefetch(self.blocks[j], wait=False)
            if not self.profiling:  # the nearest first: the copies run in order
                for j in range(i - 1, max(0, i - self.act_lead) - 1, -1):
                    self.acts.prefetch(j)
        if self.timer is not None:
            self.timer.switch("backward")

    # -- step boundary -----------------------------------------------------------------------
    def drain(self, keep_detached: bool = False) -> None:
        """Wait for queued CPU tasks; free blocks and activations a backward left behind.

        ``keep_detached``: leave blocks' detached updates running (each block's next use waits).
        """
        for g in self.groups:
            if not (keep_detached and g.detached):
                self.wait_updates(g)
            if g.grads_seen:  # some parameters got no gradient this backward
                self._grads_done(g)
                self.wait_updates(g)
            self.flush_accumulator(g)
        for g in self.blocks:
            if not g.resident and g.on_device and g.index < len(self.blocks) - 1:
                self._release(g)
        self.acts.clear()
        self._entered.clear()

    def reset_timings(self) -> None:
        """Forget forward times recorded so far (keeps activation sizes)."""
        for g in self.blocks:
            g.fwd_s = 0.0
        self.fwd_total = 0.0
        self.fwd_count = 0

    def apply(
        self,
        actions: list[Action],
        resident: list[bool],
        grad_on_device: list[bool],
        cast_on_host: list[bool],
        act_lead: int = 1,
    ) -> None:
        """Switch to a plan's per-block activation actions, residency, gradient accumulators and casts.

        ``act_lead``: backward fetches the swapped activations of that many blocks below the one it enters.
        """
        self.actions = list(actions)
        self.act_lead = act_lead
        for g, on_host in zip(self.blocks, cast_on_host, strict=True):
            if on_host:
                self.host.add_host_copy(g)  # a no-op where it exists (fp32: the master)
        for g, keep in zip(self.blocks, resident, strict=True):
            g.resident = keep
            if not keep and g.on_device and g.index < len(self.blocks) - 1:
                self._release(g)
        for g, on_device in zip(self.blocks, grad_on_device, strict=True):
            if on_device and g.acc is None:
                g.acc = self.store.empty((g.numel,), torch.float32, Tier.DEVICE, f"{g.name} gradient accumulator")
            elif not on_device and g.acc is not None:
                self.flush_accumulator(g)
                self.store.uncharge(Tier.DEVICE, g.acc.numel() * g.acc.element_size())
                g.acc = None
        self.profiling = False
        self.release_pinned_cache()

    def release_pinned_cache(self) -> None:
        """Give PyTorch's cached pinned blocks back (the profiling steps' swapped activations).

        PyTorch keeps freed pinned host blocks cached for reuse, rounded up to powers of two. The
        optimizer calls this at every profiling step's ``step()``, before the updates: the first
        step's updates make the optimizer state, and the first block's swap (always swapped, to
        measure it: 1.5 GB of saved tensors at the 7B shape and 8k tokens, more once rounded) would
        otherwise stay cached beside it until the plan (the H100 in session 13 peaked 3.7 GiB over
        its host budget). ``torch._C._host_emptyCache`` is private: skipped where absent.
        """
        empty = getattr(torch._C, "_host_emptyCache", None)
        if self.mover.cuda and empty is not None:
            torch.cuda.synchronize(self.device)
            empty()

    def close(self) -> None:
        """Remove the hooks, restore block forwards and stop the worker."""
        self.drain()
        for handle in self._handles:
            handle.remove()
        for g in self.blocks:
            if g.module is not None and "forward" in g.module.__dict__:
                del g.module.forward
        self.worker.shutdown(wait=True)
