"""A worker on carina.offload's block runtime, with the PS as its gradient and optimizer backend.

carina.offload's runtime streams each block's parameters to the device, moves every finished
gradient to host RAM (float32, one flat buffer per block) and, when a block's gradient is
final, calls its optimizer seam ``runtime.step_group(group)`` (during backward once profiling
is over, otherwise at ``step()``). :class:`PSBackend` is that optimizer: it subclasses
:class:`~carina.offload.session.OffloadOptimizer` (so profiling, planning, activation policies
and the device budget work unchanged) and replaces the update: ``step_group`` copies the
block's gradients into this worker's slots of the PS segment; ``step()`` waits for the PS
shards to reduce and update, then copies the published parameters into the block runtime's
host copies, which the runtime streams to the device before their next use.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from carina.core.errors import ConfigError
from carina.offload.blocks import ParamGroup
from carina.offload.disagg.config import DisaggConfig
from carina.offload.disagg.worker import PSLink
from carina.offload.session import OffloadOptimizer

__all__ = ["PSBackend", "offload_worker"]


class PSBackend(OffloadOptimizer):
    """The block runtime's optimizer seam, answered by the parameter server.

    Args:
        user: A stateless optimizer over the model's trainable parameters (only its parameter
            list is used; the PS runs the real optimizer).
        runtime: The wrapped model's runtime.
        budgets: The plan's budgets (from the wrap).
        link: This worker's end of the PS.
        names: Parameter name of every trainable parameter, by ``id``.
    """

    def __init__(self, user: Any, runtime: Any, budgets: Any, *, link: PSLink, names: dict[int, str]) -> None:
        super().__init__(user, runtime, budgets)
        self.link = link
        missing = [n for n in names.values() if n not in link.grads]
        if missing or len(names) != len(link.grads):
            raise ConfigError("the worker's model does not match the PS layout", key="model", param=missing[:1])
        self._routes = {g.index: [(g.slot(i), names[id(p)]) for i, p in enumerate(g.params)] for g in runtime.groups}
        self.pull()

    def step_group(self, g: ParamGroup) -> None:
        """``g``'s gradient is final: copy it into this worker's PS slots (runs on the runtime's CPU thread)."""
        for sl, name in self._routes[g.index]:
            self.link.grads[name].view(-1).copy_(g.grad[sl])
        g.stepped = True

    def step(self, closure: Any = None) -> Any:
        """Finish backward (plan after profiling), hand the gradients to the PS, take the update."""
        loss = super().step(closure)
        self.link.exchange()
        self.pull()
        return loss

    def pull(self) -> None:
        """Copy the published parameters into each group's host copy; the runtime refetches them.

        With a float32 compute dtype the host copy is the worker's master; otherwise only the
        compute-dtype copy is refreshed (the PS holds the only fp32 masters).
        """
        import torch

        with torch.no_grad():
            for g in self.rt.groups:
                self.rt.wait_updates(g)
                for sl, name in self._routes[g.index]:
                    g.host_copy[sl].copy_(self.link.published[name].view(-1))
                g.stale = True


def offload_worker(model: Any, cfg: DisaggConfig, link: PSLink, device: str) -> tuple[Any, PSBackend]:
    """Wrap ``model`` with carina.offload and attach the PS: returns the model and the optimizer to step."""
    import torch

    from carina.offload.api import handle_of, wrap

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    user = torch.optim.SGD([p for _, p in trainable], lr=0.0)  # stateless: the PS owns the optimizer
    model, _ = wrap(model, replace(cfg.offload, device=device), optimizer=user)
    handle = handle_of(model)
    backend = PSBackend(
        user, handle.runtime, handle.optimizer.budgets, link=link, names={id(p): n for n, p in trainable}
    )
    handle.optimizer = backend
    return model, backend
