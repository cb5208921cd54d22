"""The forked writer's :data:`carina.ckpt.commit.Writer`: the bytes go out from a grandchild.

A forked child must not start threads, so it cannot overlap its checksums with
the disk's work the way carina.io does for the other writers. It can fork
again: the child is single-threaded, so its own fork is safe. :func:`forked_write`
forks a grandchild that writes the file (:func:`carina.ckpt.commit.write_file_direct`:
``O_DIRECT`` from the arena, one fsync) and ``_exit``\\ s, and returns at once; the
child computes the checksums while the grandchild writes (``run_job`` calls the
writer before the checksums and its ``finish`` after them), and ``finish`` waits
for the grandchild, re-raising its error (an ``OSError`` keeps its errno, so a
full disk is still :class:`~carina.core.errors.DeviceFull`). Both read the same
shared arena pages; nothing is copied.

If the child dies, the grandchild finishes its file in the attempt's temporary
directory and exits; that directory is debris, which restore ignores and the
next commit deletes.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable

from carina.ckpt import commit
from carina.core.errors import CheckpointError

__all__ = ["forked_write"]


def forked_write(path: str, data: memoryview) -> Callable[[], None]:
    """Start writing ``data`` to ``path`` in a grandchild; the returned function waits and raises its error."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # grandchild: write the file, report, _exit; never return into the child's pipeline
        os.close(read_fd)
        code = 0
        try:
            commit.write_file_direct(path, data)
        except BaseException as exc:  # noqa: BLE001 - reported to the child through the pipe
            code = 1
            try:
                os.write(write_fd, pickle.dumps(exc))
            except Exception:  # noqa: BLE001 - unpicklable: its text
                os.write(write_fd, pickle.dumps(CheckpointError(str(exc)[:2000])))
        os._exit(code)
    os.close(write_fd)

    def finish() -> None:
        message = b""
        while chunk := os.read(read_fd, 1 << 16):  # until the grandchild exits (EOF), then reap it
            message += chunk
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            raise CheckpointError(f"writer grandchild killed by {sig} while writing", path=path)
        if os.WEXITSTATUS(status) != 0:
            raise pickle.loads(message) if message else CheckpointError("writer grandchild failed", path=path)

    return finish
