"""Optimizer state spilled to NVMe, moved beside the CPU updates instead of in series with them.

Where host RAM cannot hold every block's optimizer state, the plan spills some blocks' state to
NVMe (``BlockPlan.state_on_nvme``) and keeps one block's state in RAM at a time, in a buffer the
spilled blocks share (the *slot*; :func:`~carina.offload.stepmodel.host_bytes` counts it). Read a
block's state, update it, write it back, one after the other, and the disk idles while the CPU
updates and between steps (the H200 in session 10: the 1.65 s of updates and the step's other work
added 2.3 s to 49.65 s of disk in a 51.96 s step). :class:`SpillPipeline` keeps the disk busy with
that same one slot:

* **Write-back beside the update.** A spilled block is updated one parameter tensor at a time (the
  user's optimizer over that tensor, so per-tensor semantics do not change), smallest first, and each
  tensor's state is written as soon as it is updated, while the next one is. The update returns
  without waiting for the writes; ``step()`` waits for the last ones.
* **Read-ahead.** Once a block's writes have ended, the pipeline's thread starts reading the next
  spilled block's state: the one an update waits for, else the first whose update is queued (the CPU
  worker takes blocks by index), else (from the step's first forward on) the one whose gradients come
  next. The read runs beside whatever happens meanwhile: the forward, the backward before that block's
  gradients, other updates. While the slot holds a queued block's read, the worker takes no other
  spilled block's update (:meth:`SpillPipeline.may_take`): by index it would take a lower block whose
  gradients came later, and the read ahead would be thrown away and done again (a whole block's state;
  3.2 GB on a 7B model).

The disk never reads and writes at once (a disk's mixed rate can be below its serial rates: 1.83 GB/s
on the H200 against 1.75 read and 2.39 write), and the host ledger never holds more than one block's
state: a read starts (and is charged) only after the last block's writes ended (and were given back).
A block's update starts only once all of its state is in RAM, so a failed read leaves the block as it
was (weights and state on NVMe untouched) and raises :class:`~carina.core.errors.IOEngineError` from
that block's update. A failed write keeps the block's state in RAM (still charged); ``step()`` raises
it, and so does every later spilled update, until ``load_state_dict`` starts over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from carina.core.errors import CapacityError, CarinaError, IOEngineError
from carina.memory.tiers import Tier
from carina.offload.spillslot import Slot, SlotMoves, StateShape, per_element, state_key, state_of

if TYPE_CHECKING:
    from carina.memory.batch import NvmeBatch
    from carina.memory.store import TensorStore
    from carina.offload.blocks import ParamGroup
    from carina.offload.timing import StepTimer

__all__ = ["SpillPipeline"]


class SpillPipeline(SlotMoves):
    """The spilled blocks' optimizer state: where it is, and the moves that keep the disk busy.

    Args:
        store: The ledger and the NVMe tier.
        inner: The optimizer over the masters (its ``state`` holds the blocks' state tensors).
        groups: The runtime's parameter groups, by index.
        due: The spilled blocks whose update is queued this step, in the order they will run.
        timer: The runtime's step timer (None: not timing).
    """

    def __init__(
        self,
        store: TensorStore,
        inner: torch.optim.Optimizer,
        groups: list[ParamGroup],
        due: Callable[[], list[int]],
        timer: Callable[[], StepTimer | None],
    ) -> None:
        self.store, self.inner, self.groups = store, inner, groups
        self._due, self._timer = due, timer
        self.spilled: dict[int, list[StateShape]] = {}  # blocks whose state is on NVMe now
        self.buffer: torch.Tensor | None = None  # the slot's memory, 4 KiB-aligned views for O_DIRECT
        self.log: list[tuple[str, int, int]] | None = None  # (event, block, detail) when a test asks
        self._cv = threading.Condition()
        self._slot = Slot()
        self._error: CarinaError | None = None  # a failed write: no spilled update runs until settle(discard=True)
        self._thread: threading.Thread | None = None
        self._taken: set[int] = set()  # blocks whose update began this step
        self._wanted: int | None = None  # the block an update is waiting to read
        self._ahead = False  # a step's first forward began: blocks may be read before their update is queued
        self._descending = False  # this step's updates come as backward makes gradients, last block first
        self._skip: set[int] = set()  # read ahead in vain this step (no room in the ledger then)
        self.discarded_bytes = 0  # state read ahead for a block whose update came later: read twice

    # -- the updating thread ---------------------------------------------------------------------
    def update(self, g: ParamGroup, step_tensor: Callable[[int], None], updated: Callable[[], None]) -> None:
        """Update spilled block ``g`` tensor by tensor, its state going back to NVMe as each is done.

        Args:
            g: The block.
            step_tensor: Updates master ``k`` of ``g`` (its state must be in ``inner.state``).
            updated: Called after the last tensor, before the state is handed to the writes.

        Raises:
            IOEngineError: The block's state could not be read (the block is not updated), or an
                earlier block's write-back failed.
            CapacityError: The host ledger had no room for the block's state (the block is not updated).
        """
        self._acquire(g)
        timer, spent = self._timer(), 0.0
        try:
            for k in sorted(range(len(g.masters)), key=lambda k: g.masters[k].numel()):
                self._note("update", g.index, k)
                t0 = time.perf_counter()
                step_tensor(k)
                spent += time.perf_counter() - t0
                self._write_tensor(g, k)
            updated()
        except BaseException as exc:
            self._release(g, failed=exc)
            raise
        if timer is not None:
            timer.add("optim_update_s", spent)
        self._release(g)

    def _acquire(self, g: ParamGroup) -> None:
        """Make ``g``'s state usable in ``inner.state``: the read ahead, or a read now; the slot is ``g``'s."""
        i, t0 = g.index, time.perf_counter()
        self._note("acquire", i)
        read = self._claim(i)
        if read is not None:
            self._finish_read(g, read)
        timer = self._timer()
        if timer is not None:
            timer.add("optim_disk_wait_s", time.perf_counter() - t0)

    def _claim(self, i: int) -> NvmeBatch | None:
        """Wait until the slot is ``i``'s; the read of its state to wait for (None: nothing to read)."""
        with self._cv:
            self._taken.add(i)
            while True:
                if self._error is not None:
                    raise self._error
                s = self._slot
                if s.phase == "free" and i not in self.spilled:
                    self._slot = Slot(block=i, phase="updating")  # state in RAM (or made by this update)
                    return None
                if s.block != i and i in self.spilled:
                    self._wanted = i  # the pipeline's thread reads it next, once the slot is free
                if s.phase == "free" or (s.phase == "reading" and s.read is None and s.error is None):
                    self._kick()
                elif s.phase == "reading" and s.block == i:
                    self._wanted = None
                    if s.error is not None:
                        self._slot = Slot()
                        self._cv.notify_all()
                        raise self._read_error(i, s.error)
                    assert s.read is not None
                    return s.read
                elif s.phase == "reading":  # another block's state, read ahead in vain: give it back
                    assert s.read is not None or s.error is not None
                    self._drop_read(s)
                    continue
                self._cv.wait()

    def _finish_read(self, g: ParamGroup, read: NvmeBatch) -> None:
        """Wait for ``g``'s read; on success its state goes into ``inner.state`` and its NVMe copy is dropped."""
        try:
            read.wait()
        except BaseException as exc:  # noqa: BLE001 - the slot is given back, then it is raised
            with self._cv:
                self.store.uncharge(Tier.HOST, self._slot.charged)
                self._slot = Slot()
                self._cv.notify_all()
            raise self._read_error(g.index, exc)  # noqa: B904 - its cause is set
        self._note("read_done", g.index)
        timer = self._timer()
        if timer is not None:
            timer.add("optim_disk_s", read.seconds)
        shapes = self.spilled.pop(g.index)
        for (mp, name, _, _), key, t in zip(shapes, self._keys(g.index, shapes), self._views(shapes), strict=True):
            self.store.drop(key)
            self.inner.state[mp][name] = t
        with self._cv:
            self._slot.phase = "updating"

    def _write_tensor(self, g: ParamGroup, k: int) -> None:
        """Start writing master ``k``'s updated state (a failure to start is kept for the release)."""
        s, mp = self._slot, g.masters[k]
        state = state_of(self.inner, mp)
        if not state or s.error is not None:
            return
        self._note("write", g.index, k)
        items = [(state_key(g.index, k, name), t) for name, t in state]
        try:
            s.writes.append((self.store.start_put_nvme(items), [key for key, _ in items]))
        except BaseException as exc:  # noqa: BLE001 - raised once the block is updated, see _release
            s.error = exc
            return
        s.written += [(mp, name, tuple(t.shape), t.dtype) for name, t in state]

    def _release(self, g: ParamGroup, failed: BaseException | None = None) -> None:
        """Hand the updated state to the pipeline's thread, which waits for its writes."""
        self._note("release", g.index)
        with self._cv:
            s = self._slot
            s.charged = sum(t.numel() * t.element_size() for t in per_element(self.inner, g))
            if failed is not None and s.error is None:
                s.error = failed
            s.phase = "writing"
            self._kick()

    def write_now(self, g: ParamGroup, uncharge: bool) -> None:
        """Write ``g``'s state in RAM to NVMe and wait (``load_state_dict``); RAM keeps none of it."""
        shapes: list[StateShape] = []
        items = []
        for k, mp in enumerate(g.masters):
            for name, t in state_of(self.inner, mp):
                items.append((state_key(g.index, k, name), t))
                shapes.append((mp, name, tuple(t.shape), t.dtype))
        self.store.put_nvme(items)
        self._spilled_now(g.index, shapes, uncharge)

    def read_out(self) -> list[tuple[Any, str, torch.Tensor]]:
        """Every spilled state tensor read into a fresh tensor, as ``(master, state name, tensor)``."""
        out = []
        for i, shapes in self.spilled.items():
            fresh = [torch.empty(shape, dtype=dt) for _, _, shape, dt in shapes]
            self.store.read_nvme(list(zip(self._keys(i, shapes), fresh, strict=True)))
            out += [(mp, name, t) for (mp, name, _, _), t in zip(shapes, fresh, strict=True)]
        return out

    def forget(self) -> None:
        """Drop every spilled state tensor from NVMe (``load_state_dict`` replaces them)."""
        for i, shapes in self.spilled.items():
            for key in self._keys(i, shapes):
                self.store.drop(key)
        self.spilled.clear()

    def may_take(self, i: int) -> bool:
        """Whether the CPU worker may start block ``i``'s update now (its ``ready`` test, with the copies').

        Not while the slot holds the read of another spilled block whose update is queued and not begun:
        that one goes first, so no read is thrown away. Read without the lock: a stale answer costs at worst
        a discarded read, and the worker never waits on it (with nothing ready it takes the earliest task).
        """
        s = self._slot
        j = s.block
        if i not in self.spilled or j is None or j == i or s.phase != "reading" or j in self._taken:
            return True
        return not self.groups[j].queued

    # -- steps, waits and resets -----------------------------------------------------------------------
    def forward_starts(self, descending: bool) -> None:
        """A step's first forward: from now on, read blocks ahead of their update, before it is even queued.

        ``descending``: the blocks are updated during backward, which hands them over last block first (else
        at ``step()``, first block first).
        """
        with self._cv:
            self._ahead, self._descending = True, descending
            if self._slot.phase == "free":
                self._kick()

    def end_step(self) -> None:
        """The step's updates are done: nothing is read ahead until the next step's first forward."""
        with self._cv:
            self._ahead, self._wanted = False, None
            self._taken.clear()
            self._skip.clear()

    def settle(self, discard: bool = False) -> None:
        """Wait until no write is in flight and the pipeline's thread is idle.

        With ``discard`` (``load_state_dict``), also give back the state read ahead and a failed write's
        state, and clear the failure: the next step starts over.
        """
        with self._cv:
            self._cv.wait_for(lambda: self._slot.phase not in ("writing", "updating") and self._thread is None)
            s = self._slot
            if discard and s.phase == "reading":
                self._drop_read(s)
            if discard and s.phase == "failed":
                self.store.uncharge(Tier.HOST, s.charged)
                self._slot, self._error = Slot(), None

    @property
    def error(self) -> CarinaError | None:
        """The failed write that stops spilled updates (None: none)."""
        return self._error

    # -- helpers ----------------------------------------------------------------------------------------
    def _read_error(self, i: int, exc: BaseException) -> CarinaError:
        if isinstance(exc, CapacityError):
            return exc  # the ledger had no room for the block's state: the plan's error, as it is
        name = self.groups[i].name
        err = IOEngineError(
            f"reading the optimizer state of {name} from NVMe failed ({exc}); {name} was not updated: its "
            f"weights and its state on NVMe are as before this step",
            block=name,
        )
        err.__cause__ = exc
        return err
