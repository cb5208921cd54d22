"""A worker on carina.offload's block runtime, with the PS as its gradient and optimizer backend.

carina.offload's runtime streams each block's parameters to the device, moves every finished
gradient to host RAM (float32, one flat buffer per block) and, when a block's gradient is
final, calls its optimizer seam ``runtime.step_group(group)`` (during backward once profiling
is over, otherwise at ``step()``). :class:`PSBackend` is that optimizer: it subclasses
:class:`~carina.offload.session.OffloadOptimizer` (so profiling, planning, activation policies
and the device budget work unchanged) and replaces the update: ``step_group`` copies the
block's gradients into this worker's slots of the PS segment; ``step()`` tells the PS the
gradients are in and returns. The shards publish parameter by parameter in the order the next
forward needs them, and one pull thread copies each group's published parameters into the
block runtime's host copy as soon as that group is complete; the copy is the group's pending
update (``ParamGroup.updates``), which the runtime already waits for before it streams the
group to the device. So the PS update overlaps the next forward instead of stalling the step.
While profiling (the plan may change residency at that step) the pull is synchronous.
"""

from __future__ import annotations

import concurrent.futures as cf
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
        self._puller = cf.ThreadPoolExecutor(1, thread_name_prefix="carina-ps-pull")
        self.pull()

    def snapshot(self, g: ParamGroup) -> None:
        """None: ``step()`` waits for every gradient copy (the PS is told the step is posted after it)."""
        return None

    def step_group(self, g: ParamGroup, options: Any = None) -> None:
        """``g``'s gradient is final: copy it into this worker's PS slots (runs on the runtime's CPU thread)."""
        for sl, name in self._routes[g.index]:
            self.link.grads[name].view(-1).copy_(g.grad[sl])

    def step(self, closure: Any = None) -> Any:
        """Finish backward (plan after profiling), hand the gradients to the PS, queue the pulls."""
        profiling = self.rt.profiling
        loss = super().step(closure)
        k = self.link.post()
        rest, blocks = self.rt.groups[-1], self.rt.groups[:-1]
        for g in [rest, *blocks]:  # the order the next forward fetches them (and the PS publishes)
            self.rt.wait_updates(g)
            g.updates.append(self._puller.submit(self._pull_group, g, k))
        if profiling:
            self.finish()
        return loss

    def finish(self) -> None:
        """Wait until every queued pull is done (the last step's update is in the host copies)."""
        for g in self.rt.groups:
            self.rt.wait_params(g)

    def _pull_group(self, g: ParamGroup, k: int) -> None:
        names = [name for _, name in self._routes[g.index]]
        self.link.wait_published(names, k)
        self._copy_published(g)

    def _copy_published(self, g: ParamGroup) -> None:
        import torch

        with torch.no_grad():
            for sl, name in self._routes[g.index]:
                g.feed[sl].copy_(self.link.published[name].view(-1))
        g.stale = True

    def pull(self) -> None:
        """Copy the published parameters into each group's host copy now; the runtime refetches them.

        With a float32 compute dtype the host copy is the worker's master; otherwise only the
        compute-dtype copy is refreshed (the PS holds the only fp32 masters).
        """
        for g in self.rt.groups:
            self.rt.wait_updates(g)
            self._copy_published(g)


def offload_worker(model: Any, cfg: DisaggConfig, link: PSLink, device: str) -> tuple[Any, PSBackend]:
    """Wrap ``model`` with carina.offload and attach the PS: returns the model and the optimizer to step."""
    import torch

    from carina.offload.api import handle_of, wrap
    from carina.offload.config import ResidentMode
    from carina.offload.runtime import OffloadRuntime

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    user = torch.optim.SGD([p for _, p in trainable], lr=0.0)  # stateless: the PS owns the optimizer
    # the PS holds the masters and steps them: the worker always offloads (never the resident mode)
    model, opt = wrap(model, replace(cfg.offload, device=device, resident=ResidentMode.OFF), optimizer=user)
    handle = handle_of(model)
    assert isinstance(opt, OffloadOptimizer) and isinstance(handle.runtime, OffloadRuntime)
    backend = PSBackend(user, handle.runtime, opt.budgets, link=link, names={id(p): n for n, p in trainable})
    handle.optimizer = backend
    return model, backend
