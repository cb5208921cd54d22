"""Zero-value compression (ZVC) of many blocks per launch, in torch.

A block of ``L`` bytes is stored as a bitmap of its non-zero bytes (``L/8``
bytes, bit ``j`` of byte ``k`` = byte ``8k+j`` is non-zero) followed by those
bytes in order. It is the scheme of compressing DMA engines: no dictionary, no
serial dependency, so one launch handles a whole batch of blocks on a GPU. The
same code runs on the CPU (``device="cpu"``), which is how it is tested here.
Disk images and sparse tensors shrink well; dense text does not (those blocks
fall back to raw).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from carina.infra.storage.codecs import ERR_CHECKSUM, ERR_CORRUPT, Codec, Job, Result

__all__ = ["run_zvc_jobs", "zvc_compress", "zvc_decompress"]


def _torch() -> Any:
    import torch

    return torch


def zvc_compress(blocks: Any) -> tuple[Any, Any, Any]:
    """Compress a ``(n, L)`` uint8 tensor; return ``(bitmaps (n, L/8), counts (n,), values)``."""
    torch = _torch()
    n, length = blocks.shape
    mask = blocks != 0
    weights = (1 << torch.arange(8, device=blocks.device, dtype=torch.int32)).to(torch.uint8)
    bitmaps = (mask.view(n, length // 8, 8).to(torch.uint8) * weights).sum(-1, dtype=torch.uint8)
    return bitmaps, mask.sum(1), blocks[mask]


def zvc_decompress(bitmaps: Any, values: Any) -> Any:
    """Inverse of :func:`zvc_compress`: ``(n, L/8)`` bitmaps and the flat values -> ``(n, L)``."""
    torch = _torch()
    n, nbytes = bitmaps.shape
    shifts = torch.arange(8, device=bitmaps.device, dtype=torch.uint8)
    mask = ((bitmaps.unsqueeze(-1) >> shifts) & 1).bool().view(n, nbytes * 8)
    out = torch.zeros((n, nbytes * 8), dtype=torch.uint8, device=bitmaps.device)
    return out.masked_scatter_(mask, values)


def _rows(arena: np.ndarray, offsets: Sequence[int], length: int, device: str) -> Any:
    """The blocks at ``offsets`` as one ``(n, length)`` tensor on ``device``.

    Blocks of one request lie back to back in its slot; then the arena itself is
    viewed (no gather copy) and copied once into pinned memory for the DMA.
    """
    torch = _torch()
    first, n = offsets[0], len(offsets)
    if all(o == first + k * length for k, o in enumerate(offsets)):
        rows = arena[first : first + n * length].reshape(n, length)
        if device == "cpu":
            return torch.from_numpy(rows.copy())
        return torch.from_numpy(rows).pin_memory().to(device, non_blocking=True)
    host = torch.from_numpy(np.stack([arena[o : o + length] for o in offsets]))
    if device != "cpu":
        host = host.pin_memory().to(device, non_blocking=True)
    return host


def _compress_group(arena: np.ndarray, mv: memoryview, jobs: Sequence[Job], device: str) -> list[Result]:
    length = jobs[0][3]
    bitmaps, counts, values = zvc_compress(_rows(arena, [j[2] for j in jobs], length, device))
    bitmaps, counts, values = bitmaps.cpu().numpy(), counts.cpu().numpy(), values.cpu().numpy()
    head = length // 8
    results: list[Result] = []
    start = 0
    for i, (_, _, so, sl, do, _, _) in enumerate(jobs):
        count = int(counts[i])
        size = head + count
        if count == 0:
            results.append((Codec.RAW, 0, 0))
        elif size >= sl:
            mv[do : do + sl] = mv[so : so + sl]
            results.append((Codec.RAW, sl, zlib.crc32(mv[do : do + sl])))
        else:
            arena[do : do + head] = bitmaps[i]
            arena[do + head : do + size] = values[start : start + count]
            results.append((Codec.ZVC, size, zlib.crc32(mv[do : do + size])))
        start += count
    return results


def _decompress_group(arena: np.ndarray, mv: memoryview, jobs: Sequence[Job], device: str) -> list[Result]:
    torch = _torch()
    length = jobs[0][5]
    head = length // 8
    results: list[Result] = [(Codec.ZVC, ERR_CORRUPT, 0)] * len(jobs)
    good: list[int] = []
    for i, (_, _, so, sl, _, _, crc) in enumerate(jobs):
        if zlib.crc32(mv[so : so + sl]) != crc:
            results[i] = (Codec.ZVC, ERR_CHECKSUM, 0)
        elif sl >= head:
            bits = np.unpackbits(arena[so : so + head], bitorder="little")
            if int(bits.sum()) == sl - head:
                good.append(i)
    if not good:
        return results
    bitmaps = _rows(arena, [jobs[i][2] for i in good], head, device)
    values = torch.from_numpy(np.concatenate([arena[jobs[i][2] + head : jobs[i][2] + jobs[i][3]] for i in good]))
    out = zvc_decompress(bitmaps, values.to(bitmaps.device)).cpu().numpy()
    for row, i in enumerate(good):
        do = jobs[i][4]
        arena[do : do + length] = out[row]
        results[i] = (Codec.ZVC, length, jobs[i][6])
    return results


def run_zvc_jobs(mv: memoryview, jobs: Sequence[Job], *, device: str = "cpu") -> list[Result]:
    """Run ZVC jobs on ``device``, batching jobs of equal block length into one launch each."""
    arena = np.frombuffer(mv, dtype=np.uint8)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, job in enumerate(jobs):
        groups[(job[0], job[3] if job[0] == 0 else job[5])].append(i)
    results: list[Result | None] = [None] * len(jobs)
    for (op, length), idx in groups.items():
        batch = [jobs[i] for i in idx]
        if length % 8:
            out: list[Result] = [(Codec.ZVC, ERR_CORRUPT, 0)] * len(batch)
        elif op == 0:
            out = _compress_group(arena, mv, batch, device)
        else:
            out = _decompress_group(arena, mv, batch, device)
        for i, res in zip(idx, out, strict=True):
            results[i] = res
    return [r for r in results if r is not None]
