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

from collections.abc import Sequence
from typing import Any

from carina.infra.storage.codecs import Codec, Job, Result

__all__ = ["pack_rows", "run_zvc_jobs", "unpack_rows", "zvc_compress", "zvc_decompress"]


def _torch() -> Any:
    import torch

    return torch


def zvc_compress(blocks: Any) -> tuple[Any, Any, Any]:
    """Compress a ``(n, L)`` uint8 tensor; return ``(bitmaps (n, L/8), counts (n,), values)``."""
    bitmaps, counts, mask = _bitmaps(blocks)
    return bitmaps, counts, blocks[mask]


def zvc_decompress(bitmaps: Any, values: Any) -> Any:
    """Inverse of :func:`zvc_compress`: ``(n, L/8)`` bitmaps and the flat values -> ``(n, L)``."""
    torch = _torch()
    n, nbytes = bitmaps.shape
    shifts = torch.arange(8, device=bitmaps.device, dtype=torch.uint8)
    mask = ((bitmaps.unsqueeze(-1) >> shifts) & 1).bool().view(n, nbytes * 8)
    out = torch.zeros((n, nbytes * 8), dtype=torch.uint8, device=bitmaps.device)
    return out.masked_scatter_(mask, values)


def pack_rows(rows: Any) -> tuple[Any, Any, Any]:
    """ZVC-encode each row of ``(n, L)`` uint8 ``rows`` in place of its block, all rows in one launch sequence.

    Returns ``(packed (n, L), codec (n,), size (n,))``: a row that shrinks holds
    its bitmap and non-zero bytes (zeros after ``size``) with codec ZVC; a row
    that does not shrink is copied raw (codec RAW, size ``L``); an all-zero row
    is a hole (codec RAW, size 0, all zero).
    """
    torch = _torch()
    n, length = rows.shape
    head = length // 8
    bitmaps, counts, mask = _bitmaps(rows)
    pos = head + mask.cumsum(1) - 1
    keep = mask & (pos < length)
    out = torch.zeros((n, length + 1), dtype=torch.uint8, device=rows.device)  # column L: where dropped bytes go
    out.scatter_(1, torch.where(keep, pos, length), rows)
    out[:, :head] = bitmaps
    size = head + counts
    raw = size >= length
    packed = torch.where(raw.unsqueeze(1), rows, out[:, :length])
    size = torch.where(counts == 0, 0, torch.where(raw, length, size))
    codec = torch.where(raw | (counts == 0), int(Codec.RAW), int(Codec.ZVC))
    return packed, codec, size


def _bitmaps(rows: Any) -> tuple[Any, Any, Any]:
    torch = _torch()
    n, length = rows.shape
    mask = rows != 0
    weights = (1 << torch.arange(8, device=rows.device, dtype=torch.int32)).to(torch.uint8)
    bitmaps = (mask.view(n, length // 8, 8).to(torch.uint8) * weights).sum(-1, dtype=torch.uint8)
    return bitmaps, mask.sum(1), mask


def unpack_rows(rows: Any, codec: Any, size: Any) -> tuple[Any, Any]:
    """Decode stored rows (``size`` bytes of each ``(n, L)`` row are data, the rest must be zero).

    Returns ``(blocks (n, L), ok (n,))``: ``ok`` is False for a ZVC row whose
    bitmap does not match its size and for a RAW row that is not ``L`` bytes;
    such rows decode to zeros.
    """
    torch = _torch()
    n, length = rows.shape
    head = length // 8
    shifts = torch.arange(8, device=rows.device, dtype=torch.uint8)
    mask = ((rows[:, :head].unsqueeze(-1) >> shifts) & 1).bool().view(n, length)
    counts = mask.sum(1)
    is_raw = codec == int(Codec.RAW)
    ok = torch.where(is_raw, size == length, (size >= head) & (counts == size - head))
    idx = (head + mask.cumsum(1) - 1).clamp_(0, length - 1)
    decoded = torch.where(mask, rows.gather(1, idx), 0)
    out = torch.where(is_raw.unsqueeze(1), rows, decoded)
    return torch.where(ok.unsqueeze(1), out, 0), ok


def run_zvc_jobs(mv: memoryview, jobs: Sequence[Job], *, device: str = "cpu") -> list[Result]:
    """Run ZVC jobs on ``device``: jobs of equal block length go to the device as one batch each."""
    from carina.infra.storage.zvcbatch import ZvcBatcher

    return ZvcBatcher(mv, device).run(jobs)
