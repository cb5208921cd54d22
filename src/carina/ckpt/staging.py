"""Snapshot tensors into preallocated host arenas without stalling the GPU.

Each checkpoint is staged into one of two arenas (A/B), laid out byte for byte
like the shard file (:mod:`carina.ckpt.layout`). On CUDA the device-to-host
copies run on a side stream that first waits for the compute stream, and an
event marks their end: training goes on at once, and only an optimizer step
(which would overwrite parameters not yet copied) waits for that event. On CPU
the copy is a plain ``copy_``.

With a device snapshot (``device_snapshot``: on, or auto when the GPU has room),
the side stream first copies the parameters and optimizer state into a spare
device buffer (device-to-device, HBM speed) and only then to the host arena: the
optimizer step waits for the device copy alone, and the PCIe copy runs while the
next steps compute (the stream's order keeps the next snapshot from overwriting
the buffer before its bytes left).

Host tensors whose owner lends them (``lent``: address ranges the owner guards,
see :mod:`carina.ckpt.hostcopy`) are copied on a background thread instead of
inside ``stage``; :meth:`Stager.guard_writes` is the owner's write guard. Every
other host tensor is copied in ``stage``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from carina.ckpt.hostcopy import LazyCopies, extent, span
from carina.ckpt.layout import Layout, dtype_name, plan_layout, torch_dtype

__all__ = ["ArenaFactory", "Snapshot", "Stager", "device_snapshot_fits", "host_arena"]

#: ``device_snapshot="auto"`` uses a spare device buffer only when it takes at most this share of free memory.
AUTO_FREE_SHARE = 0.25

#: Makes a flat uint8 host tensor of at least n bytes; returns (tensor, keep-alive handle).
ArenaFactory = Callable[[int], tuple[Any, Any]]


def host_arena(nbytes: int) -> tuple[Any, Any]:
    """A :class:`carina.ckpt.shm.MappedArena` of exactly ``nbytes`` (pinned when CUDA is present)."""
    from carina.ckpt.shm import mapped_arena

    return mapped_arena(nbytes)


@dataclass
class Snapshot:
    """One staged shard: which arena, its layout, and the copy's completion event."""

    arena: int
    layout: Layout
    image: Any  # uint8 tensor, len == layout.size
    event: Any = None  # torch.cuda.Event or None
    released: Any = None  # torch.cuda.Event: the device-side copy is done (parameters may change)
    lazy: LazyCopies | None = None  # lent host tensors copied behind training (their owner guards writes)
    lent_offsets: tuple[int, ...] = ()  # image offset of each of ``lazy``'s slots, ascending (its copy order)

    def wait_released(self) -> None:
        """Block until the unguarded sources may change (device snapshot: its D2D copy; else every GPU byte).

        Lent host tensors are not waited for: their owner calls the write guard first.
        """
        if self.released is not None:
            self.released.synchronize()
            self.released = None
            return
        if self.event is not None:
            self.event.synchronize()
            self.event = None

    def wait(self) -> None:
        """Block until every byte is in host memory.

        Raises:
            CheckpointError: A background host copy failed.
        """
        self.wait_released()
        if self.lazy is not None:
            self.lazy.wait()

    def ready(self) -> bool:
        """Whether every byte is in host memory (never blocks)."""
        return (self.event is None or bool(self.event.query())) and (self.lazy is None or self.lazy.done())

    def unlent_ready(self) -> bool:
        """Whether every byte but the lent slots' is in host memory (never blocks)."""
        return self.event is None or bool(self.event.query())

    def frontier(self, prefix: int) -> int:
        """The image offset below which every byte is final once the first ``prefix`` lent slots are copied.

        Meaningful once :meth:`unlent_ready`: the header and every other slot are then final.
        """
        return self.lent_offsets[prefix] if prefix < len(self.lent_offsets) else self.layout.size

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the lent host copies finish (from their thread); nothing without any."""
        if self.lazy is not None:
            self.lazy.on_done(callback)

    def view(self) -> memoryview:
        """The staged bytes as a memoryview (valid while the arena lives)."""
        return memoryview(self.image.numpy())


class Stager:
    """Copies named tensors into A/B host arenas.

    Args:
        factory: Allocates an arena (grown when the state grows).
        arenas: How many arenas to rotate (2: A/B).
        device_snapshot: ``off``, ``on`` or ``auto``: copy the guarded CUDA tensors into a
            spare device buffer first (see the module docstring); ``auto`` when
            :func:`device_snapshot_fits`; either falls back to direct copies when the
            buffer cannot be allocated.
    """

    def __init__(self, factory: ArenaFactory = host_arena, arenas: int = 2, device_snapshot: str = "off") -> None:
        self._factory = factory
        self._device_mode = device_snapshot  # "off", "on" or "auto"
        self._dev: Any = None  # the spare device buffer (flat uint8)
        self._bufs: list[tuple[Any, Any] | None] = [None] * arenas
        self._layout: Layout | None = None
        self._stream: Any = None
        self._lazy: list[LazyCopies] = []  # lent host copies that may still be running
        self._views: dict[Any, tuple[Any, Layout, dict[str, Any]]] = {}  # arena or "dev" -> (buffer, layout, views)
        self.pending: Snapshot | None = None

    @property
    def arenas(self) -> int:
        """Number of arenas rotated."""
        return len(self._bufs)

    def handle(self, arena: int) -> Any:
        """The keep-alive handle of an arena (writers use it, e.g. a shared-memory name)."""
        buf = self._bufs[arena]
        return None if buf is None else buf[1]

    def host_bytes(self) -> int:
        """Bytes held by all arenas."""
        return sum(int(b[0].numel()) for b in self._bufs if b is not None)

    def preallocate(self, nbytes: int) -> None:
        """Allocate every arena now (pinning is slow: better before training than in a save)."""
        for i in range(len(self._bufs)):
            self._image(i, nbytes)

    def stage(
        self,
        tensors: Mapping[str, Any],
        arena: int,
        guarded: frozenset[int] = frozenset(),
        lent: Sequence[tuple[int, int]] = (),
    ) -> Snapshot:
        """Start copying ``tensors`` into ``arena``; returns before CUDA copies and lent host copies finish.

        Args:
            tensors: Name to tensor.
            arena: Which arena to fill.
            guarded: ``data_ptr()`` of CUDA tensors that only an optimizer step changes
                (parameters, optimizer state): they are copied on the side stream. Any
                other CUDA tensor (buffers a forward pass updates, user tensors) is
                copied on the compute stream, so later kernels cannot change it first.
            lent: ``[start, end)`` address ranges of host memory whose owner calls
                :meth:`guard_writes` before writing it: contiguous host tensors inside
                them are copied on a background thread.
        """
        import torch

        layout = self._plan(tensors)
        image = self._image(arena, layout.size)
        image[: layout.data_start].copy_(torch.frombuffer(bytearray(layout.header), dtype=torch.uint8))
        on_gpu = [t for t in tensors.values() if t.is_cuda]
        compute = None
        if on_gpu:
            compute = torch.cuda.current_stream(on_gpu[0].device)
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=on_gpu[0].device)
            self._stream.wait_stream(compute)
        side = [s for s in layout.slots if tensors[s.name].is_cuda and tensors[s.name].data_ptr() in guarded]
        dev = self._device_buffer(tensors, side) if side else None
        on_side = {s.name for s in side}
        later: list[tuple[Any, Any]] = []
        offsets: list[int] = []  # layout.slots go in offset order, so ``later`` does too
        ranges = _Ranges(lent)
        whole = self._bufs[arena]
        assert whole is not None  # allocated by _image above
        host = self._views_of(arena, whole[0], layout)
        devs = self._views_of("dev", dev, layout) if dev is not None else {}
        for slot in layout.slots:
            src = tensors[slot.name]
            dst = _view(host, whole[0], layout.data_start, slot)
            if ranges.holds(src):
                later.append((dst, src))
                offsets.append(layout.data_start + slot.offset)
            elif slot.name in on_side:
                with torch.cuda.stream(self._stream):  # with a device buffer: D2D now, D2H below
                    (dst if dev is None else _view(devs, dev, 0, slot)).copy_(src, non_blocking=True)
                src.record_stream(self._stream)
            else:
                dst.copy_(src, non_blocking=src.is_cuda)  # on the compute stream
        released = None
        if dev is not None:
            released = torch.cuda.Event()
            released.record(self._stream)  # what the optimizer step waits for
            with torch.cuda.stream(self._stream):
                for slot in side:
                    host[slot.name].copy_(devs[slot.name], non_blocking=True)
        event = None
        if compute is not None:
            self._stream.wait_stream(compute)  # the event also covers the compute-stream copies
            event = torch.cuda.Event()
            event.record(self._stream)
        lazy = LazyCopies(later) if later else None
        if lazy is not None:
            self._lazy = [c for c in self._lazy if not c.done()] + [lazy]
        self.pending = Snapshot(arena, layout, image, event, released, lazy, tuple(offsets))
        return self.pending

    def _views_of(self, key: Any, buf: Any, layout: Layout) -> dict[str, Any]:
        """Slot name -> view of ``buf``, kept while ``buf`` and ``layout`` stay the same objects.

        Building a view costs a few tensor ops per slot, so a state of many tensors (a 350M Llama with
        AdamW: 876) paid for all of them inside every ``save()``; they are made once per arena now.
        """
        cached = self._views.get(key)
        if cached is None or cached[0] is not buf or cached[1] is not layout:
            cached = (buf, layout, {})
            self._views[key] = cached
        return cached[2]

    def guard_writes(self, tensors: Iterable[Any]) -> None:
        """The write guard of lent memory: return once no byte of ``tensors``' storages is still to be copied."""
        if not any(not c.done() for c in self._lazy):
            return
        spans = [extent(t) for t in tensors]
        for lazy in self._lazy:
            lazy.before_write(spans)

    def _device_buffer(self, tensors: Mapping[str, Any], slots: list[Any]) -> Any:
        """The spare device buffer for ``slots`` (indexed by their layout offsets), or None: no device snapshot."""
        import torch

        if self._device_mode == "off":
            return None
        need = max(s.offset + s.nbytes for s in slots)
        device = tensors[slots[0].name].device
        if self._dev is not None and self._dev.numel() >= need and self._dev.device == device:
            return self._dev
        if self._dev is not None:
            self._stream.synchronize()  # the old buffer's last copies are done before it is freed
            self._dev = None
            self._views.pop("dev", None)
        free, _total = torch.cuda.mem_get_info(device)
        if self._device_mode == "auto" and not device_snapshot_fits(need, free):
            return None
        try:
            self._dev = torch.empty(need, dtype=torch.uint8, device=device)
        except torch.cuda.OutOfMemoryError:
            self._device_mode = "off" if self._device_mode == "auto" else self._device_mode
            return None
        return self._dev

    def wait(self) -> None:
        """Block until every snapshot is fully in host memory (lent host copies included)."""
        if self.pending is not None:
            self.pending.wait()
        for lazy in self._lazy:
            lazy.wait()

    def wait_released(self) -> None:
        """Block until the latest snapshot's sources may change (called before optimizer steps)."""
        if self.pending is not None:
            self.pending.wait_released()

    def close(self) -> None:
        """Release the arenas (shared-memory ones are unlinked)."""
        self.wait()
        self._lazy.clear()
        self._views.clear()
        self._dev = None
        for i, buf in enumerate(self._bufs):
            self._bufs[i] = None
            if buf is not None and hasattr(buf[1], "close"):
                buf[1].close()

    def _plan(self, tensors: Mapping[str, Any]) -> Layout:
        specs = [(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in tensors.items()]
        if self._layout is None or self._layout.signature() != tuple(sorted(specs, key=_sort_key)):
            self._layout = plan_layout(specs)
        return self._layout

    def _image(self, arena: int, size: int) -> Any:
        buf = self._bufs[arena]
        if buf is None or buf[0].numel() < size:
            self._views.pop(arena, None)  # its views hold the old arena too
            self._bufs[arena] = None  # free the old one first
            self._bufs[arena] = self._factory(_grow(size))
            buf = self._bufs[arena]
        assert buf is not None
        return buf[0][:size]


def _view(views: dict[str, Any], buf: Any, base: int, slot: Any) -> Any:
    """``slot``'s view of ``buf`` from ``views``, made and kept there the first time."""
    view = views.get(slot.name)
    if view is None:
        view = views[slot.name] = _slot_view(buf, base, slot)
    return view


def _slot_view(buf: Any, base: int, slot: Any) -> Any:
    """``slot``'s bytes of the flat uint8 ``buf`` (starting at ``base``) as a tensor of its dtype and shape."""
    return buf[base + slot.offset : base + slot.offset + slot.nbytes].view(torch_dtype(slot.dtype)).view(slot.shape)


class _Ranges:
    """``[start, end)`` address ranges, sorted and merged, for containment tests by bisection."""

    def __init__(self, ranges: Sequence[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self._starts = [lo for lo, _ in merged]
        self._ends = [hi for _, hi in merged]

    def holds(self, src: Any) -> bool:
        """Whether ``src`` is a contiguous, non-empty host tensor lying inside one range."""
        if not self._starts or src.is_cuda or not src.is_contiguous() or src.numel() == 0:
            return False
        lo, hi = span(src)
        k = bisect.bisect_right(self._starts, lo) - 1
        return k >= 0 and hi <= self._ends[k]


def device_snapshot_fits(nbytes: int, free: int) -> bool:
    """Whether ``device_snapshot="auto"`` takes a spare device buffer of ``nbytes`` with ``free`` bytes free."""
    return nbytes <= AUTO_FREE_SHARE * free


def _sort_key(spec: tuple[str, str, tuple[int, ...]]) -> tuple[int, str]:
    from carina.ckpt.manifest import DTYPE_SIZES

    return (-DTYPE_SIZES[spec[1]], spec[0])


def _grow(size: int) -> int:
    """Round arena sizes up (1/16 headroom, 4 KiB pages) so small growth does not reallocate."""
    want = size + size // 16
    return max(4096, -(-want // 4096) * 4096)
