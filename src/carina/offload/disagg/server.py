"""A parameter-server shard: reduce the workers' gradients, step the optimizer, publish.

Each shard owns the parameters :func:`~carina.offload.disagg.layout.assign_shards` gave it.
For step k it waits until every worker has written its gradients, sums them on the CPU in
worker order (0, 1, …, N−1: fixed, so results do not depend on timing), optionally
all-reduces the sum with the same shard on the other hosts (gloo), runs its optimizer on the
fp32 masters, writes the published copy, and only then marks step k+1 done. A worker that
dies before the sums are taken leaves every shard at step k: no update is ever half applied.
The optimizer's state tensors are views of the shared segment too, so the launcher can copy
the whole PS state while the shards hold at a checkpoint step (``checkpoint_every``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from carina.offload.disagg.config import DisaggConfig, PublishDtype
from carina.offload.disagg.control import Control, pid_watch
from carina.offload.disagg.layout import SharedLayout, map_segment, view
from carina.offload.disagg.state import state_views

__all__ = ["ShardServer", "make_optimizer", "serve_shard"]


def make_optimizer(params: Sequence[Any], cfg: DisaggConfig) -> Any:
    """The optimizer each shard runs (single-tensor kernels, so results match a reference exactly)."""
    import torch

    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, foreach=False)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)


def publish_dtype(cfg: DisaggConfig) -> Any:
    import torch

    return torch.float32 if cfg.publish_dtype is PublishDtype.FLOAT32 else torch.bfloat16


class ShardServer:
    """One shard's view of the segment, its masters and its optimizer."""

    def __init__(self, cfg: DisaggConfig, shard: int, layout: SharedLayout, segment: Any, control: Control) -> None:
        import torch

        self.cfg, self.shard, self.control = cfg, shard, control
        self.slots = layout.shard_slots(shard)
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

    def reduce_and_step(self) -> None:
        """Sum gradients in worker order, exchange across hosts, step, publish."""
        import torch.distributed as dist

        for master, grads in zip(self.masters, self.grads, strict=True):
            # One local worker and no exchange: its slot is the gradient (the optimizer only reads it).
            acc = grads[0] if len(grads) == 1 and self.group is None else grads[0].clone()
            for g in grads[1:]:
                acc.add_(g)
            if self.group is not None:
                dist.all_reduce(acc, group=self.group)
            master.grad = acc
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        for master, pub in zip(self.masters, self.published, strict=True):
            pub.copy_(master.detach())

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
            self.reduce_and_step()
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
    control = Control(Path(ctl_path), cfg.workers, cfg.ps_shards, create=False)
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
