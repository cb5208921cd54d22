"""The ``fork`` writer (:class:`ForkWriter`): its child's bytes go out from a grandchild.

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

The grandchild writes one :data:`carina.ckpt.commit.CHUNK` (64 MiB) at a time
(:func:`carina.ckpt.commit.serial_direct`); the block layer splits each into many
requests in flight at the device. :func:`queued_direct` keeps :data:`DEPTH` writes
of :data:`CHUNK` bytes in flight through an io_uring ring of the grandchild's own
(:class:`carina.io.backends._ring.Ring`: raw system calls, no thread of its own)
instead; it was the default in session 8 and was not faster than the one-at-a-time
writes in that session's H200 run (``ckpt_fork_write_h200_s8``: two saves each), and
on the CPU machine's ext4 the kernel handed its writes to io-wq worker threads
(``ckpt_fork_write_cpu_s8``), so it is kept for the benchmark only
(``forked_write(..., aligned=queued_direct)``; docs/ckpt.md).

If the child dies, the grandchild finishes its file in the attempt's temporary
directory and exits; that directory is debris, which restore ignores and the
next commit deletes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import signal
import struct
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from carina.ckpt import commit
from carina.ckpt.commit import CommitJob, run_job
from carina.ckpt.writers import Writer, WriterKind, copy_error, renice, unpickle_error
from carina.core.errors import CheckpointError

if TYPE_CHECKING:
    from carina.ckpt.staging import Snapshot

__all__ = ["CHUNK", "DEPTH", "ForkWriter", "forked_write", "prepare", "queued_direct"]

#: :func:`queued_direct`'s bytes per direct write and how many it keeps in flight (by default).
CHUNK, DEPTH = 16 << 20, 8


def prepare() -> bool:
    """Import the ring module in the trainer (a forked child must not import); whether io_uring works here."""
    try:
        from carina.io.backends._ring import Ring

        Ring(2).close()
    except (ImportError, OSError):
        return False
    return True


def queued_direct(
    fd: int, data: memoryview, addr: int, head: int, *, depth: int | None = None, chunk: int | None = None
) -> int:
    """An :data:`~carina.ckpt.commit.AlignedWriter` with up to ``depth`` writes of ``chunk`` bytes in flight.

    ``depth`` and ``chunk`` default to :data:`DEPTH` and :data:`CHUNK`. The ring module must have been
    imported before the fork (:func:`prepare`). Falls back to :func:`carina.ckpt.commit.serial_direct`
    where io_uring is refused.

    Raises:
        OSError: A write failed (its errno: ENOSPC for a full disk) or came back short.
    """
    from carina.io.backends._ring import OP_WRITE, Ring

    depth, chunk = depth or DEPTH, chunk or CHUNK
    try:
        ring = Ring(depth)
    except OSError:
        return commit.serial_direct(fd, data, addr, head)
    try:
        sent, inflight = 0, dict[int, int]()
        while sent < head or inflight:
            while sent < head and len(inflight) < depth:
                n = min(chunk, head - sent)
                ring.prepare(OP_WRITE, fd, sent, addr + sent, n, sent)
                inflight[sent] = n
                sent += n
            ring.enter(1)
            for offset, res in ring.completions():
                n = inflight.pop(offset)
                if res < 0:
                    raise OSError(-res, f"direct write at {offset}: {os.strerror(-res)}")
                if res != n:  # short: never seen for O_DIRECT on a preallocated file; refuse rather than guess
                    raise OSError(errno.EIO, f"short direct write at {offset}: {res} of {n} bytes")
                commit.fault_phase("data_chunk")
    finally:
        ring.close()
    return head


def forked_write(
    path: str, data: memoryview, aligned: commit.AlignedWriter = commit.serial_direct
) -> Callable[[], None]:
    """Start writing ``data`` to ``path`` in a grandchild; the returned function waits and raises its error.

    ``aligned`` writes the direct part (``commit.serial_direct``: one 64 MiB write at a time;
    :func:`queued_direct`: several in flight through io_uring).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # grandchild: write the file, report, _exit; never return into the child's pipeline
        os.close(read_fd)
        code = 0
        try:
            commit.write_file_direct(path, data, aligned)
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


class ForkWriter(Writer):
    """Forks one child per snapshot; children run one at a time, in order."""

    kind = WriterKind.FORK

    def __init__(self, nice: int = 0) -> None:
        super().__init__(nice)
        self._pending: deque[tuple[CommitJob, Snapshot]] = deque()
        self._child: tuple[int, int, int, CommitJob] | None = None  # pid, pipe fd, arena, job

    def _submit(self, job: CommitJob, snap: Snapshot, handle: Any) -> None:
        self._pending.append((job, snap))
        self._pump()

    def _pump(self, block: bool = False) -> None:
        if self._child is not None or not self._pending:
            return
        job, snap = self._pending[0]
        if block:
            with contextlib.suppress(CheckpointError):  # a failed copy: recorded below, nothing forked
                snap.wait()
        elif not snap.ready():
            return  # staging still copying: fork only once the arena is complete
        self._pending.popleft()
        if snap.lazy is not None and snap.lazy.error is not None:  # a lent slot holds stale bytes: never written
            self._errors.append(copy_error(snap.lazy.error))
            self._pump(block)  # the next pending snapshot, if any
            return
        image, arena = snap.view(), snap.arena
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():  # the child follows the fork rules: no locks, no threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # child: write, commit, _exit; never return into the trainer
            os.close(read_fd)
            _child_main(job, image, write_fd, self.nice)
        os.close(write_fd)
        self._child = (pid, read_fd, arena, job)

    def _reap(self, block: bool) -> bool:
        if self._child is None:
            return False
        pid, read_fd, _, job = self._child
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        if done == 0:
            return False
        message = os.read(read_fd, 1 << 16)
        os.close(read_fd)
        self._child = None
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            self._errors.append(CheckpointError(f"writer child killed by {sig}", key=f"step {job.step}"))
        elif os.WEXITSTATUS(status) != 0:
            self._errors.append(unpickle_error(message, job.step))
        elif len(message) == _STAMP.size:
            self._record(job.step, _STAMP.unpack(message)[0])
        return True

    def _busy(self) -> set[int]:
        self._pump()  # a snapshot still copying at submit is forked here, once its copy is done
        while self._reap(block=False):
            self._pump()
        busy = {snap.arena for _, snap in self._pending}
        if self._child is not None:
            busy.add(self._child[2])
        return busy

    def _wait(self) -> None:
        self._pump(block=True)
        while self._child is not None:
            self._reap(block=True)
            self._pump(block=True)


#: A forked child's success message: when its step was durable.
_STAMP = struct.Struct("<d")


def _child_main(job: CommitJob, image: memoryview, error_fd: int, nice: int) -> None:
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        renice(nice, 0)  # the grandchild inherits it
        when = run_job(job, image, forked_write)  # the bytes from a grandchild, the checksums meanwhile
        os.write(error_fd, _STAMP.pack(when))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent through the pipe
        code = 1
        try:
            os.write(error_fd, pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - unpicklable error: send its text
            os.write(error_fd, repr(exc).encode()[:4096])
    finally:
        os._exit(code)
