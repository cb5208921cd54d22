"""The slot of the spill pipeline and the thread that moves it: reads ahead, waits for write-backs.

:class:`SlotMoves` is the part of :class:`~carina.offload.spill.SpillPipeline` that runs on the
pipeline's own thread (started when there is something to move, gone when there is not): it waits
for a released block's writes and then marks its state as on NVMe, and it starts the read of the
next block into the free slot (see :mod:`carina.offload.spill` for which one and why). The slot is
one host buffer, grown to the largest spilled block and carved into 4 KiB-aligned views so the reads
go straight in (O_DIRECT).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from carina.core.errors import CapacityError, CarinaError, IOEngineError
from carina.memory.tiers import Tier

if TYPE_CHECKING:
    from carina.memory.batch import NvmeBatch
    from carina.memory.store import TensorStore
    from carina.offload.blocks import ParamGroup
    from carina.offload.timing import StepTimer

__all__ = ["Slot", "SlotMoves", "StateShape", "per_element", "state_key", "state_of"]

#: One spilled state tensor: the master it belongs to, its name in the optimizer's state, shape, dtype.
StateShape = tuple[Any, str, tuple[int, ...], torch.dtype]

_ALIGN = 4096


@dataclass
class Slot:
    """What occupies the one host buffer of spilled state, and how far it got."""

    block: int | None = None
    phase: str = "free"  # free | reading | updating | writing | failed
    read: NvmeBatch | None = None  # the read in flight (phase reading; None while it is being started)
    error: BaseException | None = None  # the read could not start
    charged: int = 0  # host bytes charged for the state in it
    writes: list[tuple[NvmeBatch, list[str]]] = field(default_factory=list)  # each with its keys
    written: list[StateShape] = field(default_factory=list)


class SlotMoves:
    """Mixed into :class:`~carina.offload.spill.SpillPipeline`: the slot's reads, write-backs and thread."""

    if TYPE_CHECKING:  # owned by SpillPipeline
        store: TensorStore
        inner: torch.optim.Optimizer
        groups: list[ParamGroup]
        spilled: dict[int, list[StateShape]]
        buffer: torch.Tensor | None
        log: list[tuple[str, int, int]] | None
        _cv: threading.Condition
        _slot: Slot
        _error: CarinaError | None
        _thread: threading.Thread | None
        _taken: set[int]
        _wanted: int | None
        _ahead: bool
        _descending: bool
        _skip: set[int]
        discarded_bytes: int
        _due: Callable[[], list[int]]
        _timer: Callable[[], StepTimer | None]

    # -- the pipeline's thread ----------------------------------------------------------------------
    def _kick(self) -> None:
        """Start the pipeline's thread if it is not running (under the lock); it stops when idle."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="carina-spill")  # its writes end before exit
            self._thread.start()
        self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                s = self._slot
                target = self._target() if s.phase == "free" else None
                if s.phase != "writing" and target is None:
                    self._thread = None
                    self._cv.notify_all()
                    return
                if target is not None:
                    self._slot = s = Slot(block=target, phase="reading")
            if target is not None:
                self._start_read(s, target)
            else:
                self._finish_writes(s)

    def _target(self) -> int | None:
        """The block to read next into the free slot: one an update waits for, the next due, or the next step's."""
        if self._wanted is not None and self._wanted in self.spilled:
            return self._wanted
        due = [i for i in self._due() if i in self.spilled and i not in self._taken | self._skip]
        if due:
            return due[0]
        rest = sorted(i for i in self.spilled if i not in self._taken | self._skip)
        if self._ahead and rest:  # the one whose gradients come next
            return rest[-1] if self._descending else rest[0]
        return None

    def _start_read(self, s: Slot, i: int) -> None:
        """Charge and start reading ``i``'s state into the slot (outside the lock)."""
        shapes = self.spilled[i]
        views = self._views(shapes)
        nbytes = sum(t.numel() * t.element_size() for t in views)
        read, error = None, None
        try:
            self.store.charge(Tier.HOST, nbytes, f"{self.groups[i].name} optimizer state (from NVMe)")
            try:
                read = self.store.start_read_nvme(list(zip(self._keys(i, shapes), views, strict=True)))
            except BaseException:
                self.store.uncharge(Tier.HOST, nbytes)
                raise
        except BaseException as exc:  # noqa: BLE001 - raised to the update that wants the block
            error = exc
        ahead = i != self._wanted
        self._note("read", i, int(ahead))
        with self._cv:
            if ahead and isinstance(error, CapacityError):  # no room now: its update reads it when it comes
                self._skip.add(i)
                self._slot = Slot()
            else:
                s.read, s.error, s.charged = read, error, nbytes if read is not None else 0
            self._cv.notify_all()

    def _finish_writes(self, s: Slot) -> None:
        """Wait for the slot's writes; then its state is on NVMe and the slot is free (outside the lock)."""
        errors, landed = [], []
        for batch, keys in s.writes:
            try:
                batch.wait()
                landed += keys
            except BaseException as exc:  # noqa: BLE001 - collected: every batch is waited for first
                errors.append(exc)
        error = s.error or (errors[0] if errors else None)
        assert s.block is not None
        if error is None:
            timer = self._timer()
            if timer is not None and s.writes:
                batches = [b for b, _ in s.writes]
                timer.add("optim_disk_s", max(b.ended for b in batches) - min(b.started for b in batches))
            self._spilled_now(s.block, s.written, uncharge=True)
            self._note("written", s.block)
        else:  # what did reach NVMe is dropped: the state stays in RAM, where it is (the slot)
            for key in landed:
                self.store.drop(key)
        with self._cv:
            if error is None:
                self._slot = Slot()
            else:
                s.phase = "failed"
                name = self.groups[s.block].name
                self._error = IOEngineError(
                    f"the optimizer state of {name} could not go back to NVMe ({error}); it stays in host RAM "
                    f"and no spilled block is updated until load_state_dict() starts over",
                    block=name,
                )
                self._error.__cause__ = error
            self._cv.notify_all()

    def _drop_read(self, s: Slot) -> None:
        """Give back a read-ahead nobody took (under the lock; waits for the read to end)."""
        if s.read is not None:
            try:
                s.read.wait()
                self.discarded_bytes += s.read.nbytes  # moved, then not used: the disk's wasted reads
            except BaseException:  # noqa: BLE001 - its block is read again when its update comes
                pass
            self.store.uncharge(Tier.HOST, s.charged)
        self._note("discard", s.block if s.block is not None else -1)
        self._slot = Slot()
        self._cv.notify_all()

    def _spilled_now(self, i: int, shapes: list[StateShape], uncharge: bool) -> None:
        """``i``'s state is on NVMe: placeholders in ``inner.state``, the bytes given back."""
        for mp, name, shape, dt in shapes:
            nbytes = math.prod(shape) * dt.itemsize
            self.store.note_move(Tier.HOST, Tier.NVME, nbytes)
            if uncharge:
                self.store.uncharge(Tier.HOST, nbytes)
            self.inner.state[mp][name] = torch.empty(0, dtype=dt)
        self.spilled[i] = shapes

    def _keys(self, i: int, shapes: list[StateShape]) -> list[str]:
        """The store's keys of block ``i``'s state tensors ``shapes``, in their order."""
        index = {id(mp): k for k, mp in enumerate(self.groups[i].masters)}
        return [state_key(i, index[id(mp)], name) for mp, name, _, _ in shapes]

    def _views(self, shapes: list[StateShape]) -> list[torch.Tensor]:
        """Tensors for one block's state, carved 4 KiB-aligned from the slot (grown to the largest block)."""
        sizes = [-(-math.prod(shape) * dt.itemsize // _ALIGN) * _ALIGN for _, _, shape, dt in shapes]
        if self.buffer is None or self.buffer.numel() < sum(sizes) + _ALIGN:
            self.buffer = torch.empty(sum(sizes) + _ALIGN, dtype=torch.uint8)
        off = -self.buffer.data_ptr() % _ALIGN
        views = []
        for (_, _, shape, dt), size in zip(shapes, sizes, strict=True):
            nbytes = math.prod(shape) * dt.itemsize
            views.append(self.buffer[off : off + nbytes].view(dt).view(shape))
            off += size
        return views

    def _note(self, event: str, block: int, detail: int = -1) -> None:
        log = self.log
        if log is not None:
            with self._cv:
                log.append((event, block, detail))


def state_of(inner: torch.optim.Optimizer, mp: Any) -> list[tuple[str, torch.Tensor]]:
    """``mp``'s per-element state tensors (those that spill; scalars such as a step count stay in RAM)."""
    return [(n, t) for n, t in inner.state.get(mp, {}).items() if isinstance(t, torch.Tensor) and t.numel() > 1]


def per_element(inner: torch.optim.Optimizer, g: ParamGroup) -> list[torch.Tensor]:
    """Every per-element state tensor of ``g``."""
    return [t for mp in g.masters for _, t in state_of(inner, mp)]


def state_key(block: int, k: int, name: str) -> str:
    """The store's key of master ``k`` of ``block``'s state tensor ``name``."""
    return f"state/{block}/{k}/{name}"
