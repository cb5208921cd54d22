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

from typing import Any

from carina.infra.storage.blockcodec import Codec

__all__ = ["pack_rows", "unpack_rows", "zvc_compress", "zvc_decompress"]


def _torch() -> Any:
    import torch

    return torch


def zvc_compress(blocks: Any) -> tuple[Any, Any, Any]:
    """Compress a ``(n, L)`` uint8 tensor; return ``(bitmaps (n, L/8), counts (n,), values)``."""
    mask = blocks != 0
    return _bitmap(mask), mask.sum(1), blocks[mask]


def zvc_decompress(bitmaps: Any, values: Any) -> Any:
    """Inverse of :func:`zvc_compress`: ``(n, L/8)`` bitmaps and the flat values -> ``(n, L)``."""
    torch = _torch()
    n, nbytes = bitmaps.shape
    shifts = torch.arange(8, device=bitmaps.device, dtype=torch.uint8)
    mask = ((bitmaps.unsqueeze(-1) >> shifts) & 1).bool().view(n, nbytes * 8)
    out = torch.zeros((n, nbytes * 8), dtype=torch.uint8, device=bitmaps.device)
    return out.masked_scatter_(mask, values)


def pack_rows(rows: Any, *, out: Any = None) -> tuple[Any, Any, Any]:
    """ZVC-encode each row of ``(n, L)`` uint8 ``rows`` in place of its block, all rows in one launch sequence.

    Returns ``(packed (n, L), codec (n,), size (n,))``: a row that shrinks holds
    its bitmap and non-zero bytes (zeros after ``size``) with codec ZVC; a row
    that does not shrink is copied raw (codec RAW, size ``L``); an all-zero row
    is a hole (codec RAW, size 0, all zero). No step depends on a value read
    back from the device, so a batch is launched without a synchronisation.
    ``out``: an ``(n, L)`` uint8 tensor the packed rows are written into (and returned).
    """
    torch = _torch()
    n, length = rows.shape
    head = length // 8
    mask = rows != 0
    cum = mask.cumsum(1, dtype=torch.int32)  # non-zero bytes up to and including each position
    counts = cum[:, -1].to(torch.int64)
    # byte j goes to head + (its rank among non-zero bytes); zeros and bytes past the row go to column L
    target = torch.where(mask, cum + (head - 1), length).clamp_(max=length)
    spread = torch.zeros((n, length + 1), dtype=torch.uint8, device=rows.device)
    spread.scatter_(1, target.to(torch.int64), rows)
    spread[:, :head] = _bitmap(mask)
    size = head + counts
    raw = size >= length
    packed = torch.add(rows * raw.unsqueeze(1), spread[:, :length] * ~raw.unsqueeze(1), out=out)
    size = torch.where(counts == 0, 0, torch.where(raw, length, size))
    codec = torch.where(raw | (counts == 0), int(Codec.RAW), int(Codec.ZVC))
    return packed, codec, size


def _bitmap(mask: Any) -> Any:
    """``(n, L)`` bool -> ``(n, L/8)`` uint8, bit ``j`` of byte ``k`` = position ``8k+j``."""
    torch = _torch()
    n, length = mask.shape
    weights = (1 << torch.arange(8, device=mask.device, dtype=torch.int32)).to(torch.uint8)
    return (mask.view(n, length // 8, 8).to(torch.uint8) * weights).sum(-1, dtype=torch.uint8)


def unpack_rows(rows: Any, codec: Any, size: Any) -> tuple[Any, Any]:
    """Decode stored rows (``size`` bytes of each ``(n, L)`` row are data, the rest must be zero).

    Returns ``(blocks (n, L), ok (n,))``: ``ok`` is False for a ZVC row whose
    bitmap does not match its size and for a RAW row that is not ``L`` bytes;
    such rows decode to zeros. Each byte gathers its value by its rank among
    the row's non-zero bytes, so nothing is read back from the device and a
    batch launches without a synchronisation.
    """
    torch = _torch()
    n, length = rows.shape
    head = length // 8
    shifts = torch.arange(8, device=rows.device, dtype=torch.uint8)
    mask = ((rows[:, :head].unsqueeze(-1) >> shifts) & 1).bool().view(n, length)
    cum = mask.cumsum(1, dtype=torch.int32)
    is_raw = codec == int(Codec.RAW)
    ok = torch.where(is_raw, size == length, (size >= head) & (cum[:, -1] == size - head))
    idx = (cum + (head - 1)).clamp_(0, length - 1).to(torch.int64)
    decoded = rows.gather(1, idx) * (mask & (ok & ~is_raw).unsqueeze(1))
    return decoded + rows * (ok & is_raw).unsqueeze(1), ok
