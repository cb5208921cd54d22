"""Several NBD front-end processes serving one store: one shared listening socket over a shared block map.

The parent opens (and recovers) the store once, moves its block map and log
tail into shared memory, reserves the port and forks ``N`` front ends. Each
front end has its own event loop, payload engine and slots, and listens on the
same listening socket (made by the parent before the fork), so client
connections spread over them (balanced, below). What the front ends share, and how it stays consistent:

* **Log appends and map updates** happen under one cross-process lock: the
  record is written at the shared tail and mapped before the lock is released,
  so the log is always a valid prefix (a crash can tear only its last record)
  and log order equals the order in which the map changed.
* **Map reads** take the same lock, so an entry is never seen half-updated.
  Stored bytes are immutable once written, so the read itself needs no lock.
* **Read-modify-write of partial blocks** holds an ``fcntl`` byte-range lock on
  ``<store>/locks`` (one byte per block), taken without blocking the event loop
  (retried), so two front ends never patch the same block from stale contents.
* **FLUSH** is an fsync of the shared log by whichever front end gets it; the
  map checkpoint is written by the parent when it stops.

**Connections are balanced.** The parent listens on one socket that every front
end inherits; a front end accepts only while it serves no more connections than
the least loaded one (the counts live in shared memory), so ``N`` clients land
on ``N`` different front ends instead of wherever a hash puts them (with
``SO_REUSEPORT``, which this used before, two connections shared one process
half the time).

**Live stats are merged.** Each front end republishes its counters and latency
histogram into its own slot of a shared-memory :class:`StatsBoard` (a seqlock, no
lock on the request path); the parent merges the slots every ``stats_interval``
(:class:`CombinedStats`), hands the snapshot to ``on_stats`` and writes it to
``<store>/stats.json``, as one front end does.

A front end that dies takes the others down (the parent stops them all), and
the parent dying kills the front ends (``PR_SET_PDEATHSIG``); acknowledged
writes are in the log either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np

from carina.core.errors import BackendUnavailable
from carina.infra.storage.frontstats import CombinedStats, StatsBoard, publish_every, publish_period
from carina.infra.storage.stats import write_stats_file
from carina.infra.storage.store import BlockStore

__all__ = ["SharedBlockStore", "run_frontends"]


class SharedBlockStore(BlockStore):
    """A :class:`BlockStore` whose block map and log tail live in shared memory, for forked front ends."""

    def __init__(self, directory: Path, *, size: int, block_size: int, checkpoint_bytes: int = 256 << 20) -> None:
        self._hdr = np.zeros(2, dtype=np.int64)  # tail, seq (private until _share moves them)
        super().__init__(directory, size=size, block_size=block_size, checkpoint_bytes=checkpoint_bytes)
        self._share()
        self._lock = mp.get_context("fork").Lock()
        self._range_fd = os.open(self.directory / "locks", os.O_RDWR | os.O_CREAT, 0o644)
        self.primary = True  # the process that checkpoints the map on close

    @property
    def tail(self) -> int:
        """End of the log (shared)."""
        return int(self._hdr[0])

    @tail.setter
    def tail(self, value: int) -> None:
        self._hdr[0] = value

    @property
    def seq(self) -> int:
        """Last record sequence number (shared)."""
        return int(self._hdr[1])

    @seq.setter
    def seq(self, value: int) -> None:
        self._hdr[1] = value

    def _share(self) -> None:
        """Move the map arrays and the header into one anonymous shared mapping (inherited by fork)."""
        arrays = [("loc", np.int64), ("clen", np.uint32), ("codec", np.uint8), ("crc", np.uint32)]
        n = self.nblocks
        sizes = [n * np.dtype(t).itemsize for _, t in arrays]
        offset = 16
        self._mm = mmap.mmap(-1, offset + sum(sizes))  # MAP_SHARED | MAP_ANONYMOUS
        hdr = np.frombuffer(self._mm, dtype=np.int64, count=2, offset=0)
        hdr[:] = self._hdr
        self._hdr = hdr
        for (name, dtype), nbytes in zip(arrays, sizes, strict=True):
            shared = np.frombuffer(self._mm, dtype=dtype, count=n, offset=offset)
            shared[:] = getattr(self, name)
            setattr(self, name, shared)
            offset += nbytes

    def entry(self, block: int) -> Any:
        """Where ``block`` lives (read under the map lock)."""
        with self._lock:
            return super().entry(block)

    def append(self, first: int, results: Any, payloads: Any) -> None:
        """Append and map records under the cross-process lock."""
        with self._lock:
            super().append(first, results, payloads)

    def append_zero(self, first: int, count: int) -> None:
        """Record zeroed blocks under the cross-process lock."""
        with self._lock:
            super().append_zero(first, count)

    @contextlib.asynccontextmanager
    async def exclusive(self, lo: int, hi: int) -> AsyncIterator[None]:
        """Hold blocks ``[lo, hi)`` against other front-end processes (polling, never blocking the loop)."""
        delay = 0.0002
        while True:
            try:
                fcntl.lockf(self._range_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, hi - lo, lo)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.01)
        try:
            yield
        finally:
            fcntl.lockf(self._range_fd, fcntl.LOCK_UN, hi - lo, lo)

    async def flush(self) -> None:
        """Fsync the shared log (the map is checkpointed by the primary on close)."""
        await asyncio.get_running_loop().run_in_executor(None, os.fsync, self._fd)

    def close(self) -> None:
        """Primary: fsync and checkpoint under the lock; a front end only closes its descriptors."""
        if self._fd < 0:
            return
        if self.primary:
            if self._lock.acquire(timeout=30):  # a front end killed inside the lock would hold it forever
                try:
                    super().close()
                finally:
                    self._lock.release()
            else:  # no checkpoint: the next open replays the log, which holds every acknowledged write
                os.close(self._fd)
                self._fd = -1
        else:
            os.close(self._fd)
            self._fd = -1
        os.close(self._range_fd)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _BalancedAccept:
    """Accepts from the shared listening socket only while this front end is among the least loaded."""

    def __init__(self, server: Any, listener: socket.socket, counts: np.ndarray, index: int) -> None:
        self.server, self.listener, self.counts, self.index = server, listener, counts, index
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.loop.add_reader(listener.fileno(), self._ready)

    def _resume(self) -> None:
        if not self.closed:  # a back-off that ends after close() must not watch a closed (or reused) descriptor
            self.loop.add_reader(self.listener.fileno(), self._ready)

    def _ready(self) -> None:
        # connections served plus those accepted whose adoption is still under way (not yet counted there)
        self.counts[self.index] = len(self.server.connections) + len(self.tasks)
        if self.counts[self.index] > self.counts.min():  # a less loaded front end takes it
            self.loop.remove_reader(self.listener.fileno())
            self.loop.call_later(0.002, self._resume)
            return
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return  # another front end was first
        self.counts[self.index] += 1
        task = self.loop.create_task(self.server.adopt(sock))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        self.closed = True
        self.loop.remove_reader(self.listener.fileno())
        self.listener.close()


_Shared = tuple[socket.socket, Any, StatsBoard]  # the listening socket, connection counts, live-stats slots


def _frontend_main(config: Any, store: SharedBlockStore, shared: _Shared, index: int, conn: Any) -> None:
    """One front-end process: its own loop, engine and slots over the shared store."""
    _die_with_parent()
    store.primary = False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from carina.infra.storage.service import loop_factory

    with asyncio.Runner(loop_factory=loop_factory(config.server.loop)) as runner:
        final = runner.run(_frontend(config, store, shared, index, conn))
    store.close()
    conn.send(("stopped", index, final))


async def _frontend(config: Any, store: SharedBlockStore, shared: _Shared, index: int, conn: Any) -> dict[str, Any]:
    from carina.infra.storage.listener import NbdServer
    from carina.infra.storage.stats import TierStats
    from carina.infra.storage.tier import Tier, open_engine

    sc, srv = config.store, config.server
    engine = open_engine(config)  # prepared before "ready": no warm-up inside the first requests
    tier = Tier(store, engine, slots=srv.slots, slot_bytes=srv.slot_bytes, codec=sc.codec.codec)
    stats = TierStats()
    server = NbdServer(tier, export=srv.export, stats=stats)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    listener, counts, board = shared
    acceptor = _BalancedAccept(server, listener, np.frombuffer(counts, dtype=np.int64), index)
    publisher = asyncio.ensure_future(
        publish_every(board, index, stats, engine.report, publish_period(srv.stats_interval))
    )
    try:
        conn.send(("ready", os.getpid()))
        await stop.wait()
    finally:
        publisher.cancel()
        acceptor.close()
        await server.close()
        engine.close()
    board.publish(index, stats, engine.report())  # the final counts, for the parent's combined totals
    return {**stats.snapshot(), "accepted": server.accepted, "pid": os.getpid(), **engine.report()}


def _listen(host: str, port: int) -> socket.socket:
    """The non-blocking listening socket every front end inherits and accepts from."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(256)
    sock.setblocking(False)
    return sock


def run_frontends(
    config: Any,
    *,
    processes: int,
    ready: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_stats: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Serve ``config`` from ``processes`` front-end processes until SIGTERM/SIGINT (or ``should_stop()``).

    Every ``stats_interval`` the front ends' stats are merged (:class:`CombinedStats`), written to
    ``<store>/stats.json`` and passed to ``on_stats``, as :func:`carina.infra.storage.service.serve` does.

    Returns:
        The combined final stats (with the store's space accounting) and, under ``frontends``, each
        front end's own final stats.

    Raises:
        BackendUnavailable: A front end did not start.
    """
    sc, srv = config.store, config.server
    store = SharedBlockStore(sc.path, size=sc.size, block_size=sc.block_size, checkpoint_bytes=sc.checkpoint_bytes)
    stopping = [False]
    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, lambda *_: stopping.__setitem__(0, True)) for s in (signal.SIGTERM, signal.SIGINT)}
    ctx = mp.get_context("fork")
    procs: list[Any] = []
    pipes: list[Any] = []
    finals: list[dict[str, Any]] = []
    board = StatsBoard(processes)
    combined = CombinedStats(board)
    stats_path = sc.path / "stats.json"
    try:
        listener = _listen(srv.host, srv.port)
        port = int(listener.getsockname()[1])
        counts = mmap.mmap(-1, 8 * processes)  # connections per front end, shared (MAP_SHARED | MAP_ANONYMOUS)
        for i in range(processes):
            parent, child = ctx.Pipe(duplex=False)
            shared = (listener, counts, board)
            proc = ctx.Process(target=_frontend_main, args=(config, store, shared, i, child), daemon=False)
            proc.start()
            child.close()
            procs.append(proc)
            pipes.append(parent)
        pids = [_await_ready(pipe, proc) for pipe, proc in zip(pipes, procs, strict=True)]
        listener.close()  # the front ends hold their own copies
        if ready is not None:
            ready({"port": port, "pids": pids})
        live = functools.partial(_live, combined, store, stats_path, on_stats)
        _watch(
            [p.sentinel for p in procs],
            lambda: stopping[0] or bool(should_stop and should_stop()),
            srv.stats_interval,
            live,
        )
    finally:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
        for pipe, proc in zip(pipes, procs, strict=True):
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
            with contextlib.suppress(EOFError, OSError):
                while pipe.poll(0):
                    msg = pipe.recv()
                    if msg[0] == "stopped":
                        finals.append(msg[2])
        for sig, handler in old.items():
            signal.signal(sig, handler)
        store.close()
    return {**_live(combined, store, stats_path, None), "frontends": finals}


def _live(
    combined: CombinedStats, store: SharedBlockStore, path: Path, on_stats: Callable[[dict[str, Any]], None] | None
) -> dict[str, Any]:
    """Merge the front ends' stats, write them to ``path`` (``carina storage stats`` reads it), pass them on."""
    snap = combined.snapshot(store)
    write_stats_file(path, snap)
    if on_stats is not None:
        on_stats(snap)
    return snap


def _watch(sentinels: list[Any], stopped: Callable[[], bool], interval: float, live: Callable[[], Any]) -> None:
    """Return once ``stopped()`` or a front end exits (fail-stop); call ``live()`` every ``interval`` seconds."""
    due = time.monotonic() + interval
    while not stopped():
        if mp.connection.wait(sentinels, timeout=min(0.2, max(due - time.monotonic(), 0.0))):
            return  # a front end died: the caller stops the others
        if time.monotonic() >= due:
            due = max(due + interval, time.monotonic() + interval / 2)  # no burst of snapshots after a stall
            live()


def _await_ready(pipe: Any, proc: Any) -> int:
    if not pipe.poll(120):
        raise BackendUnavailable("a front-end process did not start", pid=proc.pid)
    try:
        kind, pid = pipe.recv()
    except EOFError as exc:
        raise BackendUnavailable("a front-end process exited while starting", pid=proc.pid) from exc
    if kind != "ready":
        raise BackendUnavailable("a front-end process did not start", pid=proc.pid)
    return int(pid)
