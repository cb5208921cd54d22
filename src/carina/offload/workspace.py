"""The head's transient workspace: device bytes the output layer and the loss need beyond saved tensors.

Outside the repeated blocks, the output layer and the loss allocate large
tensors that autograd does not save for backward, so the saved-tensor hooks
never see them: for a causal LM the logits, their float32 upcast, the loss's
gradient and the log-softmax gradient (about three float32 copies of the
logits at the peak of the loss's backward). They are live while the head
runs, and a plan that ignores them can pass its check and still run out of
memory. :class:`HeadWorkspace` watches the profiling steps in the window from
the end of the last block's forward to the start of its backward (the head's
forward, the loss, and their backward):

* on CUDA it records the caching allocator's peak in the window (less what was
  allocated before carina wrapped the model and cuBLAS's per-stream
  workspaces, created first by a warm-up matrix product); the workspace is that peak minus
  what the simulator puts at the head for the profiling configuration, so
  everything the simulator does not model but is live then (the logits, the
  loss's buffers, autocast's cached weight casts) is planned for;
* where no allocator peak exists (CPU) it estimates the workspace from the
  largest floating-point output of the output layer (or the model's
  ``logits``) seen in the window:
  :func:`~carina.offload.simulator.logits_workspace_bytes`.

Resetting the allocator's peak counters is the price of the CUDA
measurement: ``torch.cuda.max_memory_allocated`` read after a profiling step
covers only what followed the last window.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from carina.offload.simulator import logits_workspace_bytes

__all__ = ["HeadWorkspace"]

log = logging.getLogger("carina.offload")


def _foreign_bytes(device: torch.device) -> int:
    """Device bytes that are not the plan's: the caller's tensors and cuBLAS's per-stream workspaces."""
    for dtype in (torch.float32, torch.bfloat16):  # cuBLAS (and cuBLASLt) keep a workspace once used
        a = torch.ones(64, 64, device=device, dtype=dtype)
        torch.nn.functional.linear(a, a, a[0]).sum()
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


class HeadWorkspace:
    """Watches the head and loss while profiling.

    Args:
        device: The compute device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.base = _foreign_bytes(device) if self.cuda else 0
        self.peak = 0  # CUDA: the largest allocator peak (less ``base``) over profiled windows
        self.fragmentation = 0  # CUDA: the largest reserved-minus-allocated peak seen in a window
        self.logits = 0  # the most logits seen in one window
        self.is_open = False

    def open(self) -> None:
        """The last block's forward ended: start the window."""
        self.is_open = True
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def note_output(self, out: Any) -> None:
        """Record the size of a head output (logits) seen while the window is open."""
        if not self.is_open:
            return
        t = getattr(out, "logits", out)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            self.logits = max(self.logits, t.numel())

    def close(self) -> None:
        """The last block's backward starts: end the window."""
        if not self.is_open:
            return
        self.is_open = False
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            self.peak = max(self.peak, peak - self.base)
            self.fragmentation = max(self.fragmentation, reserved - peak)

    def cancel(self) -> None:
        """Forget an open window (a forward without backward)."""
        self.is_open = False

    def workspace(self, simulated_head: int) -> int:
        """Bytes to add to the head stage, given what the simulator puts there for the profiling plan."""
        if self.cuda:
            if self.fragmentation:
                log.info("allocator fragmentation at the head: %d bytes reserved beyond allocated", self.fragmentation)
            return max(0, self.peak - simulated_head)
        return logits_workspace_bytes(self.logits)

    def hook(self, model: nn.Module) -> Any:
        """Watch the output layer's outputs; returns the hook handle (None when the model has none)."""
        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        if not isinstance(head, nn.Module):
            return None
        return head.register_forward_hook(lambda module, args, out: self.note_output(out))
