"""Timing of device work for the checks: warm-up, synchronise, take the best of several runs."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["best_seconds"]


def best_seconds(fn: Callable[[], object], *, device: str, repeats: int = 5, warmup: int = 2) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs after ``warmup`` runs, synchronising CUDA."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best
