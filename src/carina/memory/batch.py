"""Batches of NVMe reads or writes in flight at once, finished by whoever waits for them first.

:meth:`NvmeBatches.start_put_nvme` and :meth:`NvmeBatches.start_read_nvme` (methods of
:class:`carina.memory.store.TensorStore`) start every request of a batch and return at once;
:meth:`NvmeBatch.wait` waits for all of them, then
finishes the batch exactly once: a write batch's entries appear in the store only when every
write succeeded, otherwise its extents and bytes are given back and the first error is raised
(to every waiter, every time). Several threads may wait on one batch; ``TensorStore.close``
waits for the batches still running before it removes the file.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from carina.core.errors import ConfigError
from carina.memory.tiers import Tier, TierEntry

if TYPE_CHECKING:
    import torch

    from carina.memory.nvme import Extent, NvmeTier

__all__ = ["NvmeBatch", "NvmeBatches", "settle", "wait_all"]


class NvmeBatch:
    """Futures of one batch and what to do once they have all settled.

    Args:
        futures: One IO future per request (already submitted).
        commit: Called once, when every request succeeded.
        undo: Called once, when any failed (after every request settled), before the error is raised.
        nbytes: Bytes the batch moves.
    """

    def __init__(
        self, futures: list[Any], *, commit: Callable[[], None], undo: Callable[[], None], nbytes: int
    ) -> None:
        self.nbytes = nbytes
        self.started = time.perf_counter()
        self.ended = self.started if not futures else 0.0  # when its last request completed (perf_counter)
        self._futures = futures
        self._commit, self._undo = commit, undo
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None
        self._left = len(futures)
        for fut in futures:
            fut.add_done_callback(self._one_done)

    def _one_done(self, _fut: Any) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0 and not self.ended:
                self.ended = time.perf_counter()

    def done(self) -> bool:
        """Whether every request has completed (successfully or not)."""
        return all(f.done() for f in self._futures)

    @property
    def seconds(self) -> float:
        """From the batch's start to its last request's completion (0 while it runs)."""
        return max(0.0, self.ended - self.started) if self.ended else 0.0

    def wait(self) -> None:
        """Wait for every request, finish the batch once, raise its first error (every call)."""
        errors = [e for e in (settle(f) for f in self._futures) if e is not None]
        with self._lock:
            if not self.ended:  # a waiter can wake before the last future's callbacks have run
                self.ended = time.perf_counter()
            if not self._finished:
                self._finished = True
                self._error = errors[0] if errors else None
                (self._undo if errors else self._commit)()
            error = self._error
        if error is not None:
            raise error


def settle(future: Any) -> BaseException | None:
    """Wait for ``future``; its error, or None."""
    try:
        future.result()
    except BaseException as exc:  # noqa: BLE001 - collected, then raised by the caller
        return exc
    return None


def wait_all(futures: list[Any]) -> None:
    """Wait for every future, then raise the first one's error (none is left running)."""
    errors = [e for e in (settle(f) for f in futures) if e is not None]
    if errors:
        raise errors[0]


class NvmeBatches:
    """Mixed into :class:`~carina.memory.store.TensorStore`: NVMe batches that return before they finish."""

    if TYPE_CHECKING:  # owned by TensorStore
        _entries: dict[str, TierEntry]
        _keys: threading.Lock
        _reserved: set[str]
        _inflight: set[NvmeBatch]

        def charge(self, tier: Tier, nbytes: int, what: str = "") -> None:
            """The store's ledger charge."""

        def uncharge(self, tier: Tier, nbytes: int) -> None:
            """The store's ledger refund."""

        def note_move(self, src: Tier, dst: Tier, nbytes: int) -> None:
            """The store's per-route statistics."""

        def _entry(self, key: str) -> TierEntry: ...
        def _nvme_tier(self) -> NvmeTier: ...

    def start_put_nvme(self, items: list[tuple[str, torch.Tensor]]) -> NvmeBatch:
        """Start ``put_nvme`` and return at once; the batch's ``wait()`` finishes it.

        The tensors must stay unchanged until then. The keys are reserved at once (another batch
        may not use them); the entries appear when ``wait()`` sees every write succeed.
        """
        keys = [k for k, _ in items]
        with self._keys:
            if len(set(keys)) < len(keys) or any(k in self._entries or k in self._reserved for k in keys):
                raise ConfigError(f"keys already stored or repeated among {keys!r}", key=keys[0] if keys else "")
            self._reserved.update(keys)
        started: list[tuple[str, TierEntry, Extent, Any]] = []
        tier: NvmeTier | None = None
        try:
            tier = self._nvme_tier()
            for key, tensor in items:
                entry = TierEntry(Tier.NVME, tuple(tensor.shape), tensor.dtype, tensor.numel() * tensor.element_size())
                self.charge(Tier.NVME, entry.nbytes, key)
                try:
                    ext, fut = tier.write(tensor.detach().to("cpu").contiguous())
                except BaseException:
                    self.uncharge(Tier.NVME, entry.nbytes)
                    raise
                started.append((key, entry, ext, fut))
        except BaseException:
            for *_, fut in started:
                settle(fut)
            self._undo_put(tier, started, keys)
            raise

        def commit() -> None:
            with self._keys:
                for key, entry, ext, _ in started:
                    entry.extent = ext
                    self._entries[key] = entry
                self._reserved.difference_update(keys)
                self._inflight.discard(batch)

        def undo() -> None:
            self._undo_put(tier, started, keys)
            with self._keys:
                self._inflight.discard(batch)

        nbytes = sum(entry.nbytes for _, entry, _, _ in started)
        batch = NvmeBatch([f for *_, f in started], commit=commit, undo=undo, nbytes=nbytes)
        with self._keys:
            self._inflight.add(batch)
        return batch

    def _undo_put(
        self, tier: NvmeTier | None, started: list[tuple[str, TierEntry, Extent, Any]], keys: list[str]
    ) -> None:
        for _, entry, ext, _ in started:
            assert tier is not None
            tier.free(ext)
            self.uncharge(Tier.NVME, entry.nbytes)
        with self._keys:
            self._reserved.difference_update(keys)

    def start_read_nvme(self, items: list[tuple[str, torch.Tensor]]) -> NvmeBatch:
        """Start ``read_nvme`` and return at once; the batch's ``wait()`` raises a failed read's error.

        The entries must not be dropped before the batch is waited for.
        """
        entries = [(self._entry(key), out) for key, out in items]
        if any(e.tier is not Tier.NVME or e.extent is None for e, _ in entries):
            raise ConfigError("read_nvme reads NVMe entries only", key=items[0][0])
        tier = self._nvme_tier()
        futures: list[Any] = []
        try:
            for e, out in entries:
                assert e.extent is not None
                futures.append(tier.read(e.extent, out))
        except BaseException:
            for fut in futures:
                settle(fut)
            raise
        nbytes = sum(e.nbytes for e, _ in entries)

        def finish(ok: bool) -> None:
            if ok:
                self.note_move(Tier.NVME, Tier.HOST, nbytes)
            with self._keys:
                self._inflight.discard(batch)

        batch = NvmeBatch(futures, commit=lambda: finish(True), undo=lambda: finish(False), nbytes=nbytes)
        with self._keys:
            self._inflight.add(batch)
        return batch

    def wait_inflight(self) -> None:
        """Wait until every batch started so far has finished (their errors are left to their own waiters)."""
        with self._keys:
            running = list(self._inflight)
        for batch in running:
            try:
                batch.wait()
            except BaseException:  # noqa: BLE001 - raised to the batch's own waiter
                pass
