"""The CPU optimizer's worker thread and the size of its intra-op thread team.

The worker runs the gradient folds and block updates (Ratel's active gradient offloading)
beside the thread that runs carina's hooks and issues device work. PyTorch's CPU kernels
split each tensor evenly over the calling thread's OpenMP team, so a team with as many
threads as cores, next to one more busy thread, waits at every kernel's end for the thread
that lost its core; with a CUDA device the worker therefore takes one thread fewer.
"""

from __future__ import annotations

import concurrent.futures as cf

import torch

from carina.offload.config import OffloadConfig

__all__ = ["optimizer_threads", "optimizer_worker"]


def optimizer_threads(cfg: OffloadConfig, device: torch.device) -> int:
    """Intra-op threads of the CPU optimizer worker (see ``OffloadConfig.cpu_optimizer_threads``)."""
    if cfg.cpu_optimizer_threads:
        return cfg.cpu_optimizer_threads
    n = torch.get_num_threads()
    return max(1, n - 1) if device.type == "cuda" else n


def optimizer_worker(threads: int) -> cf.ThreadPoolExecutor:
    """The CPU optimizer's thread, its intra-op thread count set to ``threads``.

    ``torch.set_num_threads`` sets the calling thread's OpenMP team size and a process-wide
    default that each thread adopts the first time it runs a parallel kernel; the worker adopts
    the default first, then takes its own size, and the default is put back at once, so only
    the worker's team changes.
    """
    worker = cf.ThreadPoolExecutor(1, thread_name_prefix="carina-optim")
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
