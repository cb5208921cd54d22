"""One run of requests carried out as one operation: routing, bouncing, completion.

A *transfer* covers one request, or several adjacent ones that ``read_batch`` /
``write_batch`` merged. It picks the route (direct, bounced through an aligned
buffer, or buffered), submits one vectored op, continues after partial IO,
and finally resolves each member's future with its own bytes or its own error.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from carina.core.errors import AlignmentError, DeviceFull, IOEngineError, ShortRead
from carina.io._buffers import address_of
from carina.io._config import Direct
from carina.io._future import IOFuture, Op, OpKind
from carina.io._handle import FileHandle

__all__ = ["Member", "Route", "Transfer"]


class Route(enum.Enum):
    """How a transfer reaches the file."""

    DIRECT = "direct"  # O_DIRECT straight into/out of the caller's memory
    BOUNCE = "bounce"  # O_DIRECT through an aligned buffer, copied to/from the caller's
    BUFFERED = "buffered"  # through the page cache


@dataclass(eq=False)
class Member:
    """One caller request inside a transfer (duplicates ride along in ``copies``)."""

    offset: int
    view: memoryview
    future: IOFuture
    copies: list[tuple[memoryview, IOFuture]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.offset + self.view.nbytes


Submit = Callable[[Op], None]
Release = Callable[["Transfer"], None]
#: Returns an aligned buffer of the given size and the callable that gives it back.
Bounce = Callable[[int], tuple[np.ndarray, Callable[[], None]]]


class Transfer:
    """Carries out a run of sorted, non-overlapping members of one handle.

    Args:
        kind: Read or write.
        handle: The file.
        members: Sorted by offset; gaps between them are read into scratch.
        policy: The engine's O_DIRECT policy.
        submit: Hands an op to the backend.
        release: Called once when every member is resolved.
        bounce: Lends an aligned buffer of the given size (from the staging
            arena) and the callable that returns it, called once resolved.
    """

    def __init__(
        self,
        kind: OpKind,
        handle: FileHandle,
        members: list[Member],
        *,
        policy: Direct,
        submit: Submit,
        release: Release,
        bounce: Bounce,
    ) -> None:
        self.kind, self.handle, self.members = kind, handle, members
        self._submit, self._release, self._bounce_alloc = submit, release, bounce
        self.offset = members[0].offset
        self.views = _with_gaps(members)
        self.nbytes = members[-1].end - self.offset
        self.route = Route.BUFFERED
        self._shift = 0  # bytes of bounce buffer before self.offset
        self._bounce: np.ndarray | None = None
        self._give_back: Callable[[], None] | None = None
        self._done = 0  # bytes moved, counted from the op's first byte
        self._policy = policy

    # -- start ------------------------------------------------------------
    def start(self) -> Op | None:
        """Choose the route and return the first op to submit (or fail every member: None).

        From here on the members' futures can no longer be cancelled; if every
        one already was, nothing is submitted.
        """
        live = [m.future.set_running_or_notify_cancel() for m in self.members]
        for m in self.members:
            m.copies = [(v, f) for v, f in m.copies if f.set_running_or_notify_cancel()]
        if not any(live) and not any(m.copies for m in self.members):
            self._release(self)
            return None
        try:
            return self._first_op()
        except IOEngineError as exc:
            self._resolve(exc)
            return None

    def _first_op(self) -> Op:
        h, align = self.handle, self.handle.alignment
        if (
            h.direct
            and self.offset % align == 0
            and all(v.nbytes % align == 0 and address_of(v) % align == 0 for v in self.views)
        ):
            self.route = Route.DIRECT
            return self._op(h.direct_fd, self.offset, self.views)
        if h.direct and (self.kind is OpKind.READ or (self.offset % align == 0 and self.nbytes % align == 0)):
            return self._bounced_op(align)
        if h.direct and self._policy is Direct.ON:
            raise AlignmentError(
                f"direct='on' refuses a write not aligned to {align} B: {self.members[0].future.request}",
                path=str(h.path),
                offset=self.offset,
                nbytes=self.nbytes,
                alignment=align,
            )
        return self._op(h.fd, self.offset, self.views)

    def _bounced_op(self, align: int) -> Op:
        self.route = Route.BOUNCE
        start = self.offset - self.offset % align
        stop = -(-(self.offset + self.nbytes) // align) * align
        self._shift = self.offset - start
        self._bounce, self._give_back = self._bounce_alloc(stop - start)
        if self.kind is OpKind.WRITE:
            flat = self._bounce.data
            pos = 0
            for v in self.views:
                flat[pos : pos + v.nbytes] = v
                pos += v.nbytes
        return self._op(self.handle.direct_fd, start, [self._bounce.data])

    def _op(self, fd: int, offset: int, views: list[memoryview]) -> Op:
        return Op(kind=self.kind, fd=fd, offset=offset, views=views, on_done=self._on_done)

    # -- completion -----------------------------------------------------------
    def _on_done(self, op: Op, result: int | OSError) -> None:
        if isinstance(result, OSError):
            self._resolve(self._error(op, result))
            return
        self._done += result
        if result == 0 or result >= op.nbytes:
            self._resolve(None)
            return
        # Partial: continue through the page cache, which takes any alignment.
        self._submit(self._op(self.handle.fd, op.offset + result, _advance(op.views, result)))

    def _error(self, op: Op, exc: OSError) -> IOEngineError:
        where = {"path": str(self.handle.path), "offset": op.offset, "nbytes": op.nbytes}
        if exc.errno == errno.ENOSPC:
            return DeviceFull(f"no space left for {self.kind.value}", **where)
        if exc.errno == errno.EINVAL and op.fd == self.handle.direct_fd:
            return AlignmentError(f"O_DIRECT {self.kind.value} refused (EINVAL)", **where)
        return IOEngineError(f"{self.kind.value} failed: {exc.strerror}", errno=exc.errno, **where)

    def _resolve(self, error: IOEngineError | None) -> None:
        """Copy bounced data out, then give each member its bytes or its error."""
        useful = max(0, self._done - self._shift)
        if self._bounce is not None and self.kind is OpKind.READ:
            self._scatter(min(useful, self.nbytes))
        if self._give_back is not None:  # no op uses the bounce buffer any more
            self._give_back()
            self._bounce = self._give_back = None
        if self.kind is OpKind.WRITE and useful:
            self.handle.grow(self.offset + min(useful, self.nbytes))
        reached = self.offset + useful
        for m in self.members:
            got = min(max(reached - m.offset, 0), m.view.nbytes)
            self._settle(m.future, m, got, error)
            for view, fut in m.copies:
                if got:
                    view[:got] = m.view[:got]
                self._settle(fut, m, got, error)
        self._release(self)

    def _settle(self, fut: IOFuture, m: Member, got: int, error: IOEngineError | None) -> None:
        want = m.view.nbytes
        if fut.cancelled():
            return
        if got == want:
            fut.set_result(want)
        elif error is not None:  # each member gets its own copy, naming its own request
            context = {**error.context, "offset": m.offset, "done": got, "request": str(fut.request)}
            fut.set_exception(type(error)(error.message, **context))
        elif self.kind is OpKind.READ:
            fut.set_exception(
                ShortRead(
                    f"end of file after {got} of {want} bytes",
                    path=str(self.handle.path),
                    offset=m.offset,
                    expected=want,
                    got=got,
                    request=str(fut.request),
                )
            )
        else:
            fut.set_exception(
                IOEngineError(
                    f"write stopped after {got} of {want} bytes",
                    path=str(self.handle.path),
                    offset=m.offset,
                    request=str(fut.request),
                )
            )

    def _scatter(self, nbytes: int) -> None:
        assert self._bounce is not None
        src = self._bounce.data[self._shift : self._shift + nbytes]
        pos = 0
        for v in self.views:
            if pos >= nbytes:
                break
            take = min(v.nbytes, nbytes - pos)
            v[:take] = src[pos : pos + take]
            pos += take


_SCRATCH = memoryview(bytearray(1 << 20))


def _with_gaps(members: list[Member]) -> list[memoryview]:
    """The members' views in file order, with scratch views over the gaps between them."""
    views: list[memoryview] = []
    pos = members[0].offset
    for m in members:
        gap = m.offset - pos
        assert 0 <= gap <= _SCRATCH.nbytes, "members overlap or the gap exceeds the scratch"
        if gap:
            views.append(_SCRATCH[:gap])
        views.append(m.view)
        pos = m.end
    return views


def _advance(views: list[memoryview], nbytes: int) -> list[memoryview]:
    """``views`` with their first ``nbytes`` bytes dropped."""
    out: list[memoryview] = []
    for v in views:
        if nbytes >= v.nbytes:
            nbytes -= v.nbytes
            continue
        out.append(v[nbytes:])
        nbytes = 0
    return out
