"""The worker side: gradients leave by copies into shared memory; parameters return the same way.

A post-accumulate-grad hook copies each finished gradient into this worker's slot (a
device-to-host copy on CUDA: copy engines, no SMs) and frees it on the device. ``step()``
marks the gradients in place, waits for every PS shard to publish, and copies the new
parameters back (host-to-device).
"""

from __future__ import annotations

from typing import Any

from carina.core.errors import ConfigError
from carina.offload.disagg.config import DisaggConfig
from carina.offload.disagg.control import Control
from carina.offload.disagg.layout import SharedLayout, view
from carina.offload.disagg.server import publish_dtype

__all__ = ["DisaggWorker", "PSLink"]


class PSLink:
    """One worker's end of the PS: its gradient slots, the published parameters, the step handshake."""

    def __init__(self, cfg: DisaggConfig, rank: int, layout: SharedLayout, segment: Any, control: Control) -> None:
        import torch

        self.cfg, self.rank, self.control = cfg, rank, control
        self.grads = {s.name: view(segment, s.grads[rank], s.shape, torch.float32) for s in layout.slots}
        self.published = {s.name: view(segment, s.published, s.shape, publish_dtype(cfg)) for s in layout.slots}
        self.slot_index = {s.name: i for i, s in enumerate(layout.slots)}
        self.step_index = 0

    def post(self) -> int:
        """Say this step's gradients are in place; returns the step ``k`` they belong to."""
        k = self.step_index
        self.control.set_grad_step(self.rank, k + 1)
        self.step_index += 1
        return k

    def wait_published(self, names: list[str], k: int) -> None:
        """Wait until the update of step ``k`` of every parameter in ``names`` is published."""
        index = [self.slot_index[n] for n in names]
        self.control.wait(
            lambda: all(self.control.published(i) > k for i in index),
            timeout=self.cfg.step_timeout_s,
            what=f"parameters of step {k} ({names[0]}{', ...' if len(names) > 1 else ''})",
        )

    def exchange(self) -> None:
        """Say this step's gradients are in place; wait until every shard has published the update."""
        k = self.post()
        self.control.wait(
            lambda: all(self.control.done_step(s) > k for s in range(self.cfg.ps_shards)),
            timeout=self.cfg.step_timeout_s,
            what=f"parameters of step {k}",
        )


class DisaggWorker:
    """Attach a model to the PS: ``loss.backward(); worker.step()`` replaces the optimizer step."""

    def __init__(
        self,
        model: Any,
        cfg: DisaggConfig,
        rank: int,
        layout: SharedLayout,
        segment: Any,
        control: Control,
        *,
        device: str = "cpu",
    ) -> None:
        import torch

        self.device = device
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if [n for n, _ in params] != [s.name for s in layout.slots]:
            raise ConfigError("the worker's model does not match the PS layout", key="model")
        self.link = PSLink(cfg, rank, layout, segment, control)
        self.params = [p for _, p in params]
        self.slots = {id(p): self.link.grads[n] for n, p in params}
        self.published = [self.link.published[n] for n, _ in params]
        self._pending: list[Any] = []
        if device.startswith("cuda"):  # page-lock the shared segment so copies are DMA
            torch.cuda.cudart().cudaHostRegister(segment.data_ptr(), segment.numel(), 0)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self.load_published()

    def _grad_ready(self, p: Any) -> None:
        slot = self.slots[id(p)]
        slot.copy_(p.grad.detach().float(), non_blocking=p.grad.is_cuda)
        if p.grad.is_cuda:
            import torch

            event = torch.cuda.Event()
            event.record()
            self._pending.append(event)
        p.grad = None

    def load_published(self) -> None:
        """Copy the published parameters into the model (host-to-device on CUDA)."""
        import torch

        with torch.no_grad():
            for p, pub in zip(self.params, self.published, strict=True):
                p.copy_(pub, non_blocking=p.is_cuda)

    def step(self) -> None:
        """Hand this step's gradients to the PS and take back the updated parameters."""
        for event in self._pending:
            event.synchronize()
        self._pending.clear()
        self.link.exchange()
        self.load_published()
