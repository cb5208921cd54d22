"""The IO backend ABC: public methods validate, subclasses fill the hooks."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from carina.core.backend import Backend
from carina.core.errors import IOEngineError
from carina.io._future import Op, OpKind

if TYPE_CHECKING:
    from carina.io._gather import GatherOp

__all__ = ["IOBackend"]


class IOBackend(Backend):
    """Executes :class:`~carina.io._future.Op` s and reports each through ``op.finish``.

    Subclasses implement :meth:`_submit` (queue the ops; never block on their
    completion) and :meth:`_close` (finish or fail what is queued, stop threads).
    ``finish`` is called exactly once per op, from any thread.

    Capabilities: ``vectored`` (one op may carry many buffers), ``async``
    (completes on other threads), ``batched_submit`` (many ops per system call),
    ``real_io`` (touches the file).
    """

    name: ClassVar[str] = "?"
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, queue_depth: int = 64, workers: int = 0) -> None:
        self.queue_depth = queue_depth
        self.workers = workers or min(queue_depth, 128)  # 0: one per queue slot
        self.closed = False

    @classmethod
    def probe_reasons(cls) -> list[str]:
        """Why this backend cannot run on this machine; empty when it can (no side effects)."""
        return []

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Why this backend cannot serve ``request``; empty when it can."""
        return type(self).probe_reasons()

    def submit(self, ops: Sequence[Op]) -> None:
        """Queue ``ops``; each completes later through ``op.finish``.

        Raises:
            IOEngineError: The backend is closed.
        """
        if self.closed:
            raise IOEngineError(f"{self.name} backend is closed")
        if ops:
            self._submit(ops)

    def register_memory(self, address: int, length: int) -> bool:
        """Offer a long-lived buffer for faster IO (io_uring fixed buffers); False when unused."""
        return False

    def submit_gather(self, gather: GatherOp) -> None:
        """Queue every row of ``gather``; ``gather.finish`` runs once all are in.

        Raises:
            IOEngineError: The backend is closed.
        """
        if self.closed:
            raise IOEngineError(f"{self.name} backend is closed")
        if len(gather.offsets) == 0:
            gather.finish()
            return
        self._submit_gather(gather)

    def _submit_gather(self, gather: GatherOp) -> None:
        """Default: one op per row (backends that can vectorise override this)."""
        view = gather.view
        ops = []
        for i, (off, n, pos) in enumerate(
            zip(gather.offsets.tolist(), gather.lengths.tolist(), gather.positions.tolist(), strict=True)
        ):
            ops.append(
                Op(
                    kind=OpKind.READ,
                    fd=gather.fd,
                    offset=off,
                    views=[view[pos : pos + n]],
                    on_done=_row_callback(gather, i),
                )
            )
        self._submit(ops)

    def close(self) -> None:
        """Finish queued work and release threads and rings (idempotent)."""
        if not self.closed:
            self.closed = True
            self._close()

    @abc.abstractmethod
    def _submit(self, ops: Sequence[Op]) -> None: ...

    @abc.abstractmethod
    def _close(self) -> None: ...


def _row_callback(gather: GatherOp, row: int) -> Any:
    def done(_: Op, result: int | OSError) -> None:
        gather.results[row] = -(result.errno or 5) if isinstance(result, OSError) else result
        gather.rows_done(1)

    return done
