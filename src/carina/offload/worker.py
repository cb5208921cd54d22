"""The CPU optimizer's worker thread, the order it takes its tasks in, and its intra-op thread team.

The worker runs the gradient folds and block updates (Ratel's active gradient offloading)
beside the thread that runs carina's hooks and issues device work. Of the queued tasks whose
inputs are ready it takes the one with the lowest priority (ties in submission order): the
runtime gives folds that free staging buffers priority -2, the parameters outside blocks -1
and a block its index, so the block the next forward needs first is updated first (backward
hands them over last-first). A task is queued when its hook runs, before the device has made
its gradient (the host issues work ahead of the device), so a task whose copy is still on its
way is passed over while another one's inputs are there; when none is ready the worker takes
the earliest queued, whose copy lands first (one in-order copy stream). Taking the lowest
priority regardless (as before) can leave the worker waiting on the newest gradient's copy while
older ones sit ready; in the H200 8k record of session 5 (``s5/offload_s2_7b16l_8k``) the worker
waited 0.33 s of a 1.27 s step on copies (how much of that this order recovers is unmeasured).
PyTorch's CPU kernels
split each tensor evenly over the calling thread's OpenMP team, so a team with as many
threads as cores, next to one more busy thread, waits at every kernel's end for the thread
that lost its core; with a CUDA device the worker therefore takes one thread fewer.
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from carina.offload.config import OffloadConfig

__all__ = ["PriorityWorker", "optimizer_threads", "optimizer_worker"]


class PriorityWorker:
    """One thread running submitted callables, lowest priority first, FIFO within a priority."""

    def __init__(self, name: str = "carina-optim") -> None:
        self._queue: list[_Task] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self, fn: Callable[..., Any], *args: Any, priority: int = 0, ready: Callable[[], bool] | None = None
    ) -> cf.Future[Any]:
        """Queue ``fn(*args)``; its future.

        Args:
            fn: The task.
            *args: Its arguments.
            priority: Lower runs first among ready tasks.
            ready: Whether the task's inputs are there now (e.g. its CUDA events completed);
                None: always ready.
        """
        fut: cf.Future[Any] = cf.Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the CPU optimizer worker is shut down")
            heapq.heappush(self._queue, _Task(priority, next(self._seq), fut, fn, args, ready))
            self._cv.notify()
        return fut

    def _take(self) -> _Task:
        """The next task (under the lock): the first ready one by priority, else the earliest queued."""
        pick = next((t for t in sorted(self._queue) if t.ready is None or t.ready()), None)
        if pick is None:
            pick = min(self._queue, key=lambda t: t.seq)
        if pick is self._queue[0]:
            return heapq.heappop(self._queue)
        self._queue.remove(pick)
        heapq.heapify(self._queue)
        return pick

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                task = self._take()
            fut, fn, args = task.fut, task.fn, task.args
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001  (handed to whoever waits on the future)
                fut.set_exception(exc)

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if wait:
            self._thread.join()


@dataclass(order=True)
class _Task:
    """A queued task, ordered by (priority, submission number)."""

    priority: int
    seq: int
    fut: cf.Future[Any] = field(compare=False)
    fn: Callable[..., Any] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    ready: Callable[[], bool] | None = field(compare=False, default=None)


def optimizer_threads(cfg: OffloadConfig, device: torch.device) -> int:
    """Intra-op threads of the CPU optimizer worker (see ``OffloadConfig.cpu_optimizer_threads``)."""
    if cfg.cpu_optimizer_threads:
        return cfg.cpu_optimizer_threads
    n = torch.get_num_threads()
    return max(1, n - 1) if device.type == "cuda" else n


def optimizer_worker(threads: int) -> PriorityWorker:
    """The CPU optimizer's thread, its intra-op thread count set to ``threads``.

    ``torch.set_num_threads`` sets the calling thread's OpenMP team size and a process-wide
    default that each thread adopts the first time it runs a parallel kernel; the worker adopts
    the default first, then takes its own size, and the default is put back at once, so only
    the worker's team changes.
    """
    worker = PriorityWorker()
    before = torch.get_num_threads()
    if threads != before:
        got = worker.submit(_own_team, threads).result()
        torch.set_num_threads(before)
        assert got == threads, (got, threads)
    return worker


def _own_team(threads: int) -> int:
    torch.get_num_threads()  # this thread adopts the process default now, not later
    torch.set_num_threads(threads)
    return torch.get_num_threads()
