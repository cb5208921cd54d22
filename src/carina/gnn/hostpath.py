"""How the host slice of the static cache reaches the compute device, batch by batch.

Two paths, picked by :attr:`StoreConfig.host_gather <carina.gnn.store.StoreConfig>`:

* ``cpu``: the IO thread gathers the batch's host-cache hits into staging memory (pinned
  when batches go to a CUDA device) and assemble copies them to the device, one copy of the
  rows. The gather costs host memory bandwidth on the IO thread, and the copy a trip over
  the bus on the device's stream.
* ``device``: the compute device gathers the hits itself from the host slice, read in place
  (:func:`carina.memory.mapped.device_view`: on CUDA the pinned slice mapped into the GPU's
  address space, read across PCIe by the gather kernel; on the CPU the slice itself). No CPU
  gather, no staging, and the hits' positions stay on the device (the cache lookup does not
  copy them to the host).

``auto`` takes ``device`` on CUDA when the slice is pinned (mappable) and ``cpu`` otherwise: on a
CPU-only machine the IO thread keeps the gather off the training thread (``device`` is allowed
there too, and runs the same code as on CUDA, which is how the CPU tests check that path).

Why both, from the H200 records of lane_h200_s9 (``gnn_outofcore_*_h200_s9``, at a365d0c):
at 100% cache on the IGB-like graph (4 KiB rows) the IO thread's CPU gather of the host hits
took 56.9 ms of a 61.2 ms batch (110k rows, 451 MB, 7.9 GB/s) and bounded the run at 0.56x
in-memory, while the zero-copy peer's GPU gather from mapped pinned memory in the same run moved
1.03 GB per batch in about 19 ms (53 GB/s, about the bus's rate). On papers-like (512 B rows) the
same gather took 6.5 ms of a 16.4 ms batch and was not the bound, and the GPU reads small rows
at under half the bus's rate (about 22 GB/s in the same record), so which path is faster there
depends on the rates: the cost model prices both (``predict(host_gather=...)``).
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["HostGather", "resolve"]


class HostGather(enum.Enum):
    """Which processor gathers the host-cache hits of a batch."""

    AUTO = "auto"
    CPU = "cpu"
    DEVICE = "device"


def resolve(mode: HostGather, host: Any, device: Any) -> Any | None:
    """The host slice ``host`` as the compute ``device`` reads it in place, where that is the path to use.

    Returns:
        The slice as ``device`` reads it (the ``device`` path), or ``None`` (the ``cpu`` path);
        ``auto`` falls back to ``cpu`` where the slice cannot be read in place.

    Raises:
        BackendUnavailable: ``device`` was asked for but the slice cannot be read in place
            (a CUDA device with a pageable slice, or no CUDA).
    """
    import torch

    from carina.core.errors import BackendUnavailable
    from carina.memory.mapped import device_view

    if mode is HostGather.CPU or host is None or host.numel() == 0:
        return None
    if mode is HostGather.AUTO and torch.device(device).type != "cuda":
        return None
    view = device_view(host, device)
    if view is None and mode is HostGather.DEVICE:
        raise BackendUnavailable(f"the host slice cannot be read in place from {device} (pinned CUDA memory needed)")
    return view
