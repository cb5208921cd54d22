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

Which slabs: :func:`slab_plan` replays the first-fit carving of the buffers known
when the groups are built, for every power-of-two slab size from the largest
buffer's up to :data:`MAX_SLAB`, with the last slab shrunk to the smallest size that
holds what is left, and keeps the plan that pins least. A fixed 2 GiB slab held two
of a 7B-shape block's 810 MB buffers and pinned 36.5 GB for 28.0 GB of masters and
gradients on the H200 in session 6 (``h200/s6/offload_s2_7b16l_8k``,
``metrics.carina.pinned_slab_bytes``); 4 GiB slabs hold five.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from carina.core.errors import CapacityError
from carina.memory.arena import HostArena
from carina.memory.tiers import Tier

if TYPE_CHECKING:
    import torch
    from torch import nn

    from carina.memory.store import TensorStore

__all__ = [
    "MAX_SLAB",
    "PinnedSlabs",
    "first_fit",
    "pinned_cache_bytes",
    "process_baseline",
    "process_rss",
    "slab_plan",
    "slab_size",
]

_ALIGN = 4096
_MAX_SLAB = 1 << 31  # the slab for buffers added after the plan (a plan's host copies, staging)
#: The largest slab a plan may ask for (one pinned allocation).
MAX_SLAB = 1 << 34


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def slab_size(sizes: list[int]) -> int:
    """A power-of-two slab for buffers of ``sizes`` bytes: room for the largest, at most 2 GiB otherwise."""
    largest = max(sizes, default=0) + _ALIGN
    return max(_pow2(largest), min(_MAX_SLAB, _pow2(sum(sizes) // 8 + _ALIGN)))


def pinned_cache_bytes(nbytes: int) -> int:
    """Host bytes PyTorch's pinned allocator takes for a request of ``nbytes`` (the next power of two)."""
    return _pow2(nbytes)


def _round(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def first_fit(sizes: list[int], slab: int) -> list[list[int]]:
    """The buffers each slab of ``slab`` bytes gets under first-fit (a buffer larger than a slab: its own)."""
    room = slab - _ALIGN  # a slab's usable bytes (HostArena keeps one alignment unit for its start)
    fills: list[list[int]] = []
    used: list[int] = []
    for n in sizes:
        for k, u in enumerate(used):
            if u + n <= room:
                used[k] = _round(u + n)
                fills[k].append(n)
                break
        else:
            fills.append([n])
            used.append(_round(n))
    return fills


def _tail(sizes: list[int]) -> int:
    """The smallest power of two that holds ``sizes`` carved one after another in one slab."""
    return _pow2(sum(_round(n) for n in sizes) + _ALIGN)


def slab_plan(sizes: list[int]) -> list[int]:
    """Slab sizes, in creation order, that pin the fewest bytes for buffers of ``sizes`` carved first-fit.

    Every candidate is a power of two from the one holding the largest buffer up to
    :data:`MAX_SLAB`; the last slab of a candidate is shrunk to the smallest power of two that
    holds its buffers. Ties go to the smaller slabs.
    """
    if not sizes:
        return []
    best: list[int] | None = None
    slab = _pow2(max(sizes) + _ALIGN)
    while slab <= max(MAX_SLAB, _pow2(max(sizes) + _ALIGN)):
        fills = first_fit(sizes, slab)
        plan = [slab] * (len(fills) - 1) + [min(slab, _tail(fills[-1]))]
        plan = [max(s, _pow2(max(f) + _ALIGN)) for s, f in zip(plan, fills, strict=True)]  # oversized buffers
        if best is None or sum(plan) < sum(best):
            best = plan
        slab *= 2
    assert best is not None
    return best


class PinnedSlabs:
    """First-fit carving of pinned host buffers from power-of-two slabs.

    Args:
        store: The ledger; every buffer is charged to its host tier.
        slab: Slab size in bytes (a power of two, see :func:`slab_size`) for buffers beyond ``plan``.
        pin: ``"on"`` (page-locked slabs) or ``"off"`` (for tests without CUDA).
        plan: Sizes of the first slabs, in creation order (:func:`slab_plan`); afterwards ``slab``.
    """

    def __init__(self, store: TensorStore, slab: int, pin: str = "on", plan: list[int] | None = None) -> None:
        self.store = store
        self.slab = slab
        self.pin = pin
        self.plan = list(plan or [])
        self.arenas: list[HostArena] = []
        self.carved = 0  # bytes handed out (the ledger's)

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
        self.carved += nbytes
        for arena in self.arenas:
            try:
                return arena.alloc(shape, dtype)
            except CapacityError:
                continue
        planned = self.plan[len(self.arenas)] if len(self.arenas) < len(self.plan) else self.slab
        size = max(planned, _pow2(nbytes + _ALIGN))
        arena = HostArena(size - _ALIGN, pin=self.pin)
        self.arenas.append(arena)
        return arena.alloc(shape, dtype)


def process_rss() -> int | None:
    """This process's resident bytes now (``VmRSS`` of ``/proc/self/status``; None where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def process_baseline(model: nn.Module) -> int | None:
    """Resident bytes of this process that are not the model's: what ``host_budget`` does not cover.

    The process's RSS now less the bytes of the model's parameters and buffers in host memory (each
    storage once), which :func:`~carina.offload.wrap` moves into its own host buffers. Call it before
    ``wrap`` to size ``host_budget`` for a process limit: ``host_budget = limit - baseline - margin``.
    It holds the interpreter, torch and every library imported so far (with torch and transformers
    on the CPU: ``process_baseline_bytes`` of ``benchmarks/results/cpu/offload_host_rss.json``).
    A CUDA context and the kernels' libraries load when first used: on a GPU, measure after a first
    CUDA kernel has run. None where ``/proc`` is absent.
    """
    rss = process_rss()
    if rss is None:
        return None
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type == "cpu":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return max(0, rss - sum(seen.values()))
