"""Pinned host buffers for the parameter groups, carved from power-of-two slabs.

PyTorch's pinned-memory allocator rounds every request up to the next power of
two (and pins all of it), so one pinned tensor per buffer would cost up to
twice the bytes asked for: a 7B-shape block's float32 masters (810 MB) take a
1 GiB allocation. :class:`PinnedSlabs` asks for whole slabs whose size is
already a power of two and carves the groups' long-lived buffers (masters,
gradients, staging, host copies) out of them first-fit, so the pinned bytes
are the planned bytes plus at most the unused tail of the slabs. Buffers
larger than a slab get a slab of their own. The ledger is charged the exact
bytes of every buffer; :attr:`PinnedSlabs.reserved` is what is pinned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from carina.core.errors import CapacityError
from carina.memory.arena import HostArena
from carina.memory.tiers import Tier

if TYPE_CHECKING:
    import torch

    from carina.memory.store import TensorStore

__all__ = ["PinnedSlabs", "slab_size"]

_ALIGN = 4096
_MAX_SLAB = 1 << 31


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def slab_size(sizes: list[int]) -> int:
    """A power-of-two slab for buffers of ``sizes`` bytes: room for the largest, at most 2 GiB otherwise."""
    largest = max(sizes, default=0) + _ALIGN
    return max(_pow2(largest), min(_MAX_SLAB, _pow2(sum(sizes) // 8 + _ALIGN)))


class PinnedSlabs:
    """First-fit carving of pinned host buffers from power-of-two slabs.

    Args:
        store: The ledger; every buffer is charged to its host tier.
        slab: Slab size in bytes (a power of two, see :func:`slab_size`).
        pin: ``"on"`` (page-locked slabs) or ``"off"`` (for tests without CUDA).
    """

    def __init__(self, store: TensorStore, slab: int, pin: str = "on") -> None:
        self.store = store
        self.slab = slab
        self.pin = pin
        self.arenas: list[HostArena] = []

    @property
    def reserved(self) -> int:
        """Pinned bytes held by the slabs."""
        return sum(a.capacity + _ALIGN for a in self.arenas)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
        """An uninitialised pinned tensor charged to the host tier."""
        import torch

        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        self.store.charge(Tier.HOST, nbytes, what)
        for arena in self.arenas:
            try:
                return arena.alloc(shape, dtype)
            except CapacityError:
                continue
        size = max(self.slab, _pow2(nbytes + _ALIGN))
        arena = HostArena(size - _ALIGN, pin=self.pin)
        self.arenas.append(arena)
        return arena.alloc(shape, dtype)
