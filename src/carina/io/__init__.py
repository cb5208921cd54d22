"""carina.io: the asynchronous, batched storage engine.

Files on disk move to and from host memory (and, through pinned staging, GPU
memory) as futures; batches are deduplicated and coalesced; backends
(``uring``, ``posix``, ``null``) sit behind one small ABC and ``auto`` picks
the best one that runs here::

    from carina.io import IOEngine, IOConfig, aligned_buffer

    with IOEngine(IOConfig(queue_depth=64)) as eng:
        h = eng.open("features.bin", "r")
        buf = aligned_buffer(1 << 20)
        n = eng.read(h, 0, buf).result()

Batched row gathers at ids that may live on the GPU: ``RowGather`` (its
``auto`` path is host-initiated wherever it can run, GPU-initiated with ``path="gpu"``;
see :mod:`carina.io._rows`).

Importing this package loads NumPy but never torch.
"""

from __future__ import annotations

from carina.io._buffers import aligned_buffer
from carina.io._cache import drop_cache, make_cold, resident_fraction
from carina.io._cam import CamConfig, CamGather, CamTicket
from carina.io._config import Direct, IOConfig
from carina.io._engine import IOEngine
from carina.io._future import IOFuture, Request
from carina.io._handle import FileHandle
from carina.io._rows import RowGather, RowGatherConfig, choose_gather_path
from carina.io.backends import choose_backend

Engine = IOEngine

__all__ = [
    "CamConfig",
    "CamGather",
    "CamTicket",
    "Direct",
    "Engine",
    "FileHandle",
    "IOConfig",
    "IOEngine",
    "IOFuture",
    "Request",
    "RowGather",
    "RowGatherConfig",
    "aligned_buffer",
    "choose_backend",
    "choose_gather_path",
    "drop_cache",
    "make_cold",
    "resident_fraction",
]
