"""This process's rank and world size, and an attempt id every rank agrees on (torch.distributed when initialised)."""

from __future__ import annotations

import secrets

__all__ = ["dist_rank", "shared_token"]


def dist_rank() -> tuple[int, int]:
    """(rank, world size); (0, 1) without an initialised process group."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shared_token() -> str:
    """A fresh attempt id, the same on every rank (one broadcast when distributed)."""
    token = secrets.token_hex(6)
    rank, world = dist_rank()
    if world > 1:
        import torch.distributed as dist

        box = [token if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        token = str(box[0])
    return token
