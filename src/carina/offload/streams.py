"""Copies between host and device on side streams, ordered by events.

On CUDA, host-to-device and device-to-host copies run on their own streams so
they overlap compute; every copy is ordered after the compute work issued
before it (an event on the compute stream) and hands back an event the
consumer waits on. With ``device="cpu"`` the same calls copy synchronously and
return ``None``, so the runtime runs one code path everywhere.

A host-to-device copy between dtypes (a float32 master into a bf16 device buffer:
the cast on the device) goes through a small float32 device buffer in chunks on the
copy stream: each chunk is copied, then cast into its place by a kernel on the same
stream, so the extra device memory is one chunk, not the block.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Mover"]


class Mover:
    """Issues H2D/D2H copies for one device and tracks the events that order them.

    Args:
        device: The compute device.
    """

    #: Elements of the float32 device buffer a cast-on-device copy goes through (32 MiB).
    CAST_CHUNK = 1 << 23

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.cast_buffer: torch.Tensor | None = None  # made by the runtime when a block casts on the device
        if self.cuda:
            self.h2d_stream: Any = torch.cuda.Stream(device)
            self.d2h_stream: Any = torch.cuda.Stream(device)

    def _after_compute(self, stream: Any) -> None:
        stream.wait_stream(torch.cuda.current_stream(self.device))

    def to_device(self, dst: torch.Tensor, src: torch.Tensor, after: Any = None) -> Any:
        """Copy host ``src`` into device ``dst``; returns the event marking completion (None on CPU).

        The copy starts after the compute work issued so far and after ``after`` (an event).
        """
        if not self.cuda:
            dst.copy_(src)
            return None
        self._after_compute(self.h2d_stream)
        if after is not None:
            self.h2d_stream.wait_event(after)
        with torch.cuda.stream(self.h2d_stream):
            if dst.dtype == src.dtype:
                dst.copy_(src, non_blocking=True)
            else:
                self._cast_in(dst, src)
            event = torch.cuda.Event()
            event.record(self.h2d_stream)
        return event

    def _cast_in(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy flat host ``src`` into device ``dst`` of another dtype, chunk by chunk (on the H2D stream)."""
        buf = self.cast_buffer
        assert buf is not None and buf.dtype == src.dtype, "the runtime makes the cast buffer first"
        step = buf.numel()
        for a in range(0, src.numel(), step):
            n = min(step, src.numel() - a)
            buf[:n].copy_(src[a : a + n], non_blocking=True)
            dst[a : a + n].copy_(buf[:n])  # the cast, a kernel on this stream after the copy

    def to_host(self, dst: torch.Tensor, src: torch.Tensor) -> Any:
        """Copy device ``src`` into (pinned) host ``dst``; returns the completion event (None on CPU).

        ``src`` is kept alive for the copy (``record_stream``), so callers may drop it.
        """
        if not self.cuda:
            dst.copy_(src)
            return None
        self._after_compute(self.d2h_stream)
        with torch.cuda.stream(self.d2h_stream):
            dst.copy_(src, non_blocking=True)
            src.record_stream(self.d2h_stream)
            event = torch.cuda.Event()
            event.record(self.d2h_stream)
        return event

    def wait_on_compute(self, event: Any) -> None:
        """Make the compute stream wait for ``event`` (no-op for None)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    @staticmethod
    def all_done(events: list[Any]) -> bool:
        """Whether every event completed (None counts as completed); never blocks."""
        return all(event is None or event.query() for event in events)

    @staticmethod
    def wait_on_host(event: Any) -> None:
        """Block the calling thread until ``event`` completed (no-op for None)."""
        if event is not None:
            event.synchronize()
