"""A parameter-server shard: reduce the workers' gradients, step the optimizer, publish.

Each shard owns the parameters :func:`~carina.offload.disagg.layout.assign_shards` gave it.
For step k it waits until every worker has written its gradients, then, one parameter at a
time in the order the workers' next forward needs them (:func:`publish_order`), sums them on
the CPU in worker order (0, 1, …, N−1: fixed, so results do not depend on timing),
optionally all-reduces the sum with the same shard on the other hosts (gloo), runs its
optimizer on that fp32 master, writes the published copy and marks that parameter's step
k+1 published, so a worker's next forward starts on the first blocks while the shard still
updates the later ones. Once every parameter is published it marks step k+1 done. No update
starts before every worker's gradients are in place, so a worker that dies leaves every shard
at step k: no update is ever half applied.
The optimizer's state tensors are views of the shared segment too, so the launcher can copy
the whole PS state while the shards hold at a checkpoint step (``checkpoint_every``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from carina.offload.disagg.config import DisaggConfig, PSKernel, PublishDtype
from carina.offload.disagg.control import Control, pid_watch
from carina.offload.disagg.layout import SharedLayout, map_segment, publish_order, view
from carina.offload.disagg.state import state_views

__all__ = ["ShardServer", "make_optimizer", "serve_shard"]


def make_optimizer(params: Sequence[Any], cfg: DisaggConfig) -> Any:
    """The optimizer each shard runs: single-tensor or fused CPU kernels (:class:`PSKernel`).

    Either kernel updates each parameter on its own, so stepping one parameter at a time gives
    the same bits as stepping all at once, and a reference built with this function matches.
    """
    import torch

    fused = ps_kernel_fused(cfg)
    foreach = None if fused else False
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, foreach=foreach, fused=fused or None)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=foreach, fused=fused or None)


def ps_kernel_fused(cfg: DisaggConfig) -> bool:
    """Whether the shards run the fused CPU kernel (``auto``: when the workers compute on CUDA)."""
    if cfg.ps_kernel is PSKernel.AUTO:
        import torch

        return cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    return cfg.ps_kernel is PSKernel.FUSED


def publish_dtype(cfg: DisaggConfig) -> Any:
    import torch

    return torch.float32 if cfg.publish_dtype is PublishDtype.FLOAT32 else torch.bfloat16


class ShardServer:
    """One shard's view of the segment, its masters and its optimizer."""

    def __init__(self, cfg: DisaggConfig, shard: int, layout: SharedLayout, segment: Any, control: Control) -> None:
        import torch

        self.cfg, self.shard, self.control = cfg, shard, control
        self.slots = layout.shard_slots(shard)
        index = {s.name: i for i, s in enumerate(layout.slots)}
        self.slot_index = [index[s.name] for s in self.slots]  # each slot's place in the control block
        self.order = publish_order([s.name for s in self.slots])
        self.masters = [torch.nn.Parameter(view(segment, s.master, s.shape, torch.float32)) for s in self.slots]
        self.published = [view(segment, s.published, s.shape, publish_dtype(cfg)) for s in self.slots]
        self.grads = [
            [view(segment, s.grads[w], s.shape, torch.float32) for w in range(layout.workers)] for s in self.slots
        ]
        self.optimizer = make_optimizer(self.masters, cfg) if self.masters else None
        if self.optimizer is not None:  # the optimizer's state lives in the segment, not in this process
            for slot, master in zip(self.slots, self.masters, strict=True):
                views = state_views(segment, slot)
                if views:
                    self.optimizer.state[master] = views
        self.group: Any = None

    def reduce_and_step(self, step: int = 0) -> None:
        """Per parameter, in publish order: sum in worker order, exchange across hosts, step, publish.

        Args:
            step: The shard-local step being applied; each parameter is marked published at
                ``step + 1`` as soon as its copy is written.
        """
        import torch.distributed as dist

        for j in self.order:
            master, grads = self.masters[j], self.grads[j]
            # One local worker and no exchange: its slot is the gradient (the optimizer only reads it).
            acc = grads[0] if len(grads) == 1 and self.group is None else grads[0].clone()
            for g in grads[1:]:
                acc.add_(g)
            if self.group is not None:
                dist.all_reduce(acc, group=self.group)
            master.grad = acc
            if self.optimizer is not None:
                self.optimizer.step()  # only this master has a gradient: the others are skipped
                master.grad = None
            self.published[j].copy_(master.detach())
            self.control.set_published(self.slot_index[j], step + 1)

    def run(self, steps: int, worker_pids: Sequence[int], start: int = 0) -> None:
        """Serve ``steps`` steps, failing cleanly if a worker dies.

        ``start`` is the global step of the first one (after a restore); with
        ``checkpoint_every``, the shard holds before applying global step g (a multiple of it)
        until the launcher has taken the state of step g.
        """
        alive = pid_watch(worker_pids)
        every = self.cfg.checkpoint_every
        for k in range(steps):
            self.control.wait(
                partial(self._grads_in, k),
                timeout=self.cfg.step_timeout_s,
                what=f"gradients of step {k}",
                alive=alive,
            )
            g = start + k
            if every and k > 0 and g % every == 0:
                self.control.wait(
                    lambda g=g: self.control.taken >= g,  # type: ignore[misc]
                    timeout=self.cfg.step_timeout_s,
                    what=f"the checkpoint of step {g}",
                    alive=alive,
                )
            self.reduce_and_step(k)
            self.control.set_done_step(self.shard, k + 1)

    def _grads_in(self, k: int) -> bool:
        return all(self.control.grad_step(w) > k for w in range(self.cfg.workers))

    def state_dict(self) -> dict[str, Any]:
        """Masters and optimizer state of this shard (for carina.ckpt)."""
        return {
            "masters": {s.name: m.detach().clone() for s, m in zip(self.slots, self.masters, strict=True)},
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else {},
        }


def serve_shard(
    cfg: DisaggConfig,
    shard: int,
    layout: SharedLayout,
    seg_path: str,
    ctl_path: str,
    steps: int,
    worker_pids: Sequence[int],
    start: int = 0,
) -> None:
    """Process entry point of one PS shard."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg.ps_threads)
    segment = map_segment(Path(seg_path), layout.nbytes, create=False)
    control = Control(Path(ctl_path), cfg.workers, cfg.ps_shards, create=False, slots=len(layout.slots))
    server = ShardServer(cfg, shard, layout, segment, control)
    if cfg.hosts > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{cfg.master_addr}:{cfg.master_port + shard}",
            rank=cfg.host_rank,
            world_size=cfg.hosts,
            timeout=timedelta(seconds=cfg.step_timeout_s),
        )
        server.group = dist.group.WORLD
    try:
        server.run(steps, worker_pids, start)
    finally:
        if cfg.hosts > 1:
            dist.destroy_process_group()
