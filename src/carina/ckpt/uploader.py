"""The background uploader: committed local checkpoints to a :class:`~carina.ckpt.remote.RemoteStore`.

Each rank runs one (a thread of the trainer). It is handed ``(step, token)``
pairs once the local commit of that save attempt is visible, uploads that
rank's shard (rank 0: then waits for the other ranks' shard objects and writes
the manifest), and keeps the first failure for :meth:`Uploader.check`. It never
calls into torch.distributed: ranks coordinate through the store alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from carina.ckpt.commit import step_dir_name
from carina.ckpt.manifest import MANIFEST_NAME
from carina.ckpt.remote import RemoteStore
from carina.ckpt.storage import attempt_state
from carina.core.errors import CheckpointError

__all__ = ["Uploader"]


class Uploader:
    """Uploads committed local checkpoints in a background thread; a failure surfaces at :meth:`check`.

    Args:
        store: Where to upload.
        root: The local checkpoint directory.
        keep_last: Remote retention after each upload (0 keeps all; only rank 0 prunes).
        rank: This process's rank, or None to upload every shard of a checkpoint.
        timeout_s: How long rank 0 waits for the other ranks' shard objects.
    """

    def __init__(
        self, store: RemoteStore, root: str, keep_last: int, *, rank: int | None = None, timeout_s: float = 600.0
    ) -> None:
        import queue
        import threading

        self.store, self.root, self.keep_last = store, root, keep_last
        self.rank, self.timeout_s = rank, timeout_s
        self._queue: queue.Queue[tuple[int, str] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="carina-ckpt-upload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            step, token = item

            def current(step: int = step, token: str = token) -> bool:
                return attempt_state(self.root, step, token) is True  # False: pruned or replaced locally

            try:
                if self._error is None and current():
                    self.store.upload(
                        self.root,
                        step,
                        self.keep_last,
                        token=token,
                        rank=self.rank,
                        timeout_s=self.timeout_s,
                        wanted=_unchanged(os.path.join(self.root, step_dir_name(step), MANIFEST_NAME)),
                    )
            except BaseException as exc:  # noqa: BLE001 - kept and raised at the next check()
                if current():  # else superseded locally mid-upload
                    self._error = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def submit(self, step: int, token: str) -> None:
        """Queue save attempt ``token`` of ``step``, committed locally."""
        self._queue.put((step, token))

    def check(self) -> None:
        """Raise the first failed upload (once).

        Raises:
            CheckpointError: An upload failed.
        """
        error, self._error = self._error, None
        if isinstance(error, CheckpointError):
            raise error
        if error is not None:
            raise CheckpointError(f"checkpoint upload failed: {error!r}", path=self.store.url) from error

    def drain(self) -> None:
        """Wait until every queued upload is done, then :meth:`check`."""
        self._queue.join()
        self.check()

    def close(self) -> None:
        """Drain and stop the thread."""
        try:
            self.drain()
        finally:
            self._queue.put(None)
            self._thread.join()


def _unchanged(path: str) -> Callable[[], bool]:
    """A check that ``path`` is still the file it is now (not pruned, not replaced by a new commit).

    One ``stat`` a call: rank 0 asks it while it polls the store for other ranks' shards.
    """
    try:
        st = os.stat(path)
        ident = (st.st_ino, st.st_mtime_ns)
    except FileNotFoundError:
        ident = None

    def check() -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        return (st.st_ino, st.st_mtime_ns) == ident

    return check
