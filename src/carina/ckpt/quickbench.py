"""``carina ckpt bench``: a quick look at save stall per writer on this machine.

It saves a synthetic state of a given size with every writer and with
``torch.save`` (+fsync), timing how long ``save()`` blocks and how long until
the checkpoint is durable. No training runs, so interference is not measured:
``benchmarks/ckpt/bench_stall.py`` is the benchmark of record.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

__all__ = ["quick_bench", "timed_save", "torch_save_fsync"]

#: Untimed saves per carina writer: a checkpointer allocates (maps, pins) one arena in each of its first two.
_WARMUP = 2


def torch_save_fsync(root: str, state: dict[str, Any], step: int) -> float:
    """Seconds ``torch.save`` takes to write ``state`` to ``root/<step>.pt`` with fsync (then renamed)."""
    import torch

    t0 = time.perf_counter()
    tmp = os.path.join(root, f"{step}.pt.tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(root, f"{step}.pt"))
    return time.perf_counter() - t0


def timed_save(ckpt: Any, step: int, state: dict[str, Any]) -> tuple[float, float, float]:
    """Save ``state`` as ``step`` and wait: seconds ``save()`` blocked, until durable, until done.

    Durable is when ``latest`` named the save (the writer's marker); done adds retention.
    """
    t0 = time.monotonic()
    ckpt.save(step, state)
    t1 = time.monotonic()
    ckpt.wait()
    done = time.monotonic() - t0
    return t1 - t0, (ckpt.durable_at(step) or t0 + done) - t0, done


def quick_bench(
    size_mb: int, reps: int, writers: list[str], directory: str | None = None, torch_save: bool = True
) -> list[dict[str, Any]]:
    """Median blocking, time-to-durable and time until done (seconds) per writer, plus ``torch.save``.

    A carina save is durable once ``latest`` names it; its job is done once retention (``keep_last=1``:
    the previous save is deleted) has run too. ``torch.save`` (unless not ``torch_save``) keeps every file.
    """
    import torch

    from carina.ckpt.checkpointer import Checkpointer
    from carina.ckpt.config import CheckpointConfig
    from carina.ckpt.writers import WriterKind
    from carina.core.config import choice

    state = {"blob": torch.randn(size_mb << 18)}  # 4-byte floats: size_mb MiB
    root = tempfile.mkdtemp(prefix="carina-ckpt-quick-", dir=directory)
    rows = []
    try:
        for name in writers:
            sub = os.path.join(root, name)
            blocked: list[float] = []
            durable: list[float] = []
            done: list[float] = []
            cfg = CheckpointConfig(dir=sub, writer=choice(WriterKind, name, key="writers"), keep_last=1)
            with Checkpointer(cfg) as ckpt:
                for step in range(reps + _WARMUP):  # the first two saves allocate the two arenas: left out
                    saved = timed_save(ckpt, step, state)
                    if step >= _WARMUP:
                        for out, t in zip((blocked, durable, done), saved, strict=True):
                            out.append(t)
            rows.append({"method": f"carina-{name}", "blocking_s": statistics.median(blocked),
                         "durable_s": statistics.median(durable), "done_s": statistics.median(done)})  # fmt: skip
        if torch_save:
            os.makedirs(os.path.join(root, "torch"))
            times = [torch_save_fsync(os.path.join(root, "torch"), state, i) for i in range(reps)]
            took = statistics.median(times)
            rows.append({"method": "torch.save", "blocking_s": took, "durable_s": took, "done_s": took})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in rows:
        r["size_mb"] = size_mb
    return rows
