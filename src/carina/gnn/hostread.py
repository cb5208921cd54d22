"""The sampler thread's reads of device values on the host, in one place.

A read of a device tensor's values on the host (a size, a count, ids for the page planner) waits
for the stream that computes them: on CUDA the thread stops until the kernels queued before the
copy have run, then takes the GIL back beside the IO and training threads. The sampler and the
cache lookup read only what they cannot do without, and through these two functions, so the number
of such reads per batch is fixed (one per hop of the sampler and one more, the first hop's once an
epoch in ``NeighborSampler.batches``; two per cache lookup) and a CPU test counts them
(:func:`carina.testing.gnn_sync.count_host_syncs`), where a CPU run has no copies to see.
"""

from __future__ import annotations

import torch

__all__ = ["host_ints", "to_host"]


def host_ints(values: torch.Tensor) -> list[int]:
    """The integers of a small 1-d tensor, on the host (one wait for the device)."""
    return [int(v) for v in values.tolist()]


def to_host(values: torch.Tensor) -> torch.Tensor:
    """``values`` in CPU memory (one wait for the device when it is on one)."""
    return values.cpu()
