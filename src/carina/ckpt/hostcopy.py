"""Host-to-host snapshot copies that run behind training, protected by write guards.

Host-resident state that its owner *lends* (carina.offload's float32 masters and
optimizer state: the owner promises to call a write guard before it changes any
of those bytes in place) need not be copied inside ``save()``. A
:class:`LazyCopies` copies such slots into the arena on a background thread;
:meth:`LazyCopies.before_write` is the guard: a slot that is about to be
overwritten and is not copied yet is copied at once, in the writer's thread (or
waited for, when the background thread is copying it), so an update waits only
for the bytes it would overwrite. Everything else goes on while the copies run.

    lazy = LazyCopies([(dst, src), ...])   # starts the background thread
    lazy.before_write([tensor])            # the owner, before writing tensor in place
    lazy.wait()                            # every slot copied (errors raised here)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from carina.core.errors import CheckpointError

__all__ = ["LazyCopies", "extent", "span"]

_PENDING, _COPYING, _DONE, _FAILED = 0, 1, 2, 3


def span(tensor: Any) -> tuple[int, int]:
    """``[start, end)`` addresses of a contiguous tensor's bytes."""
    start = int(tensor.data_ptr())
    return start, start + int(tensor.numel()) * int(tensor.element_size())


def extent(tensor: Any) -> tuple[int, int]:
    """``[start, end)`` addresses ``tensor`` may touch: its bytes when contiguous, else its whole storage."""
    if tensor.is_contiguous():
        return span(tensor)
    storage = tensor.untyped_storage()
    start = int(storage.data_ptr())
    return start, start + int(storage.nbytes())


class LazyCopies:
    """Copies ``(dst, src)`` pairs on a background thread; :meth:`before_write` copies a slot first on demand.

    Args:
        pairs: Destination and contiguous host source of each copy (same dtype and shape).
    """

    def __init__(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        self._pairs = list(pairs)
        self._spans = [span(src) for _, src in self._pairs]
        self._state = [_PENDING] * len(self._pairs)
        self._left = len(self._pairs)
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._watchers: list[Callable[[int, bool], None]] = []
        self._prefix = 0  # slots 0 .. _prefix-1 are copied without error
        self._failed = False
        self.forced = 0  # slots copied by before_write (a write came before the background thread)
        self._thread = threading.Thread(target=self._run, name="carina-ckpt-hostcopy", daemon=True)
        self._thread.start()

    @property
    def slots(self) -> int:
        """How many slots this snapshot copies behind training."""
        return len(self._spans)

    def done(self) -> bool:
        """Whether every slot is copied (never blocks)."""
        return self._left == 0

    def wait(self) -> None:
        """Block until every slot is copied.

        Raises:
            CheckpointError: A copy failed.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._left == 0)
        if self._error is not None:
            raise CheckpointError(f"snapshot copy failed: {self._error!r}") from self._error

    @property
    def error(self) -> BaseException | None:
        """The first copy's failure, if any (set before its slot counts as finished)."""
        return self._error

    def watch(self, callback: Callable[[int, bool], None]) -> None:
        """Call ``callback(prefix, failed)`` now and after every slot copied, on the copying thread.

        ``prefix``: how many leading slots (in the order given) are copied without error; it only
        grows, but two threads (the background one, a write guard's) may report out of order.
        ``failed``: a copy failed (the prefix stops below that slot).
        """
        with self._cond:
            self._watchers.append(callback)
            prefix, failed = self._prefix, self._failed
        callback(prefix, failed)

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the copying thread) once every slot is copied; at once if they are."""
        with self._cond:
            if self._left:
                self._callbacks.append(callback)
                return
        callback()

    def before_write(self, spans: Iterable[tuple[int, int]]) -> None:
        """Return once no slot overlapping ``spans`` is still to be copied (copying pending ones here)."""
        if self._left == 0:
            return
        wanted = [(lo, hi) for lo, hi in spans if hi > lo]
        hits = [i for i, (lo, hi) in enumerate(self._spans) if any(lo < b and a < hi for a, b in wanted)]
        for i in hits:
            if self._claim(i):
                self._copy(i)
                self.forced += 1
        with self._cond:
            self._cond.wait_for(lambda: all(self._state[i] >= _DONE for i in hits))

    def _run(self) -> None:
        for i in range(len(self._pairs)):
            if self._claim(i):
                self._copy(i)

    def _claim(self, i: int) -> bool:
        with self._cond:
            if self._state[i] != _PENDING:
                return False
            self._state[i] = _COPYING
            return True

    def _copy(self, i: int) -> None:
        dst, src = self._pairs[i]
        ok = True
        try:
            dst.copy_(src)
        except BaseException as exc:  # noqa: BLE001 - raised by wait(); the slot still counts as finished
            self._error = self._error or exc
            ok = False
        callbacks: list[Callable[[], None]] = []
        with self._cond:
            self._state[i] = _DONE if ok else _FAILED
            self._left -= 1
            self._failed = self._failed or not ok
            while self._prefix < len(self._state) and self._state[self._prefix] == _DONE:
                self._prefix += 1
            prefix, failed, watchers = self._prefix, self._failed, list(self._watchers)
            if self._left == 0:
                self._pairs.clear()  # drop the references to the sources
                callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for watcher in watchers:
            watcher(prefix, failed)
        for callback in callbacks:
            callback()
