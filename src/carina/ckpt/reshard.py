"""Restore at another world size: each rank's new piece assembled from the saved pieces.

A DTensor (``torch.distributed.tensor``, what FSDP2's ``fully_shard`` and
tensor parallelism put in state dicts) is saved as its local piece plus the
piece's box in the global tensor: ``global_shape`` and ``global_offset`` in the
manifest. On restore, the target state says which box each rank now needs
(its own DTensors' meshes and placements, or the whole tensor for a plain
target); :func:`plan_reads` names the saved shards that overlap it and
:func:`assemble` copies the overlapping sub-boxes into a fresh tensor. Pieces
held by several ranks (replicated dimensions) are read once, and a box that the
saved pieces do not cover raises instead of leaving stale values.

Supported placements: ``Shard(d)`` (even or uneven, on any mesh dimension) and
``Replicate()``; a ``Partial`` tensor (a pending reduction) or a strided shard
cannot be saved.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from carina.ckpt.manifest import Manifest, TensorEntry
from carina.core.errors import CheckpointError

__all__ = ["Box", "Chunk", "assemble", "chunk_of", "pieces", "plan_reads", "source_rank", "wrap_like"]

#: (offset, shape) of a box inside a global tensor.
Box = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Chunk:
    """One rank's piece of a DTensor: where it lies in the global tensor and how it is placed."""

    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    local: Any = None  # the local tensor (save side)
    mesh: Any = None
    placements: tuple[Any, ...] = ()
    stride: tuple[int, ...] = ()

    @property
    def box(self) -> Box:
        """``(offset, shape)``."""
        return self.offset, self.shape


def _dtensor_type() -> Any:
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def chunk_of(value: Any, path: str) -> Chunk | None:
    """The :class:`Chunk` of a DTensor (None for any other tensor).

    Raises:
        CheckpointError: A placement that has no single box per rank (``Partial``,
            strided shards), named by ``path``.
    """
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(value, dtensor):
        return None
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for p in value.placements:
        if type(p) not in (Shard, Replicate):
            raise CheckpointError(f"cannot checkpoint a DTensor placed as {p}; redistribute it first", key=path)
    shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
    local = value.to_local().detach()
    if tuple(local.shape) != tuple(shape):
        raise CheckpointError(
            f"DTensor's local piece is {tuple(local.shape)}, its placement implies {tuple(shape)}", key=path
        )
    return Chunk(
        global_shape=tuple(value.shape),
        offset=tuple(offset),
        shape=tuple(shape),
        local=local,
        mesh=value.device_mesh,
        placements=tuple(value.placements),
        stride=tuple(value.stride()),
    )


def source_rank(rank: int, saved_world: int) -> int:
    """Whose rank-local state (small state, RNG, plain tensors) ``rank`` restores: ``rank mod N``."""
    return rank % saved_world


def pieces(manifest: Manifest, name: str, prefer: int) -> dict[Box, tuple[int, TensorEntry]]:
    """The distinct saved boxes of tensor ``name``, each with one rank holding it (``prefer`` first)."""
    out: dict[Box, tuple[int, TensorEntry]] = {}
    for shard in sorted(manifest.shards, key=lambda s: (s.rank != prefer, s.rank)):
        for t in shard.tensors:
            if t.name == name and t.global_shape is not None and t.global_offset is not None:
                out.setdefault((t.global_offset, t.shape), (shard.rank, t))
    return out


def _overlap(a: Box, b: Box) -> tuple[tuple[int, int], ...] | None:
    """Per dimension ``[lo, hi)`` of the intersection in global coordinates (None if empty)."""
    spans = []
    for ao, an, bo, bn in zip(a[0], a[1], b[0], b[1], strict=True):
        lo, hi = max(ao, bo), min(ao + an, bo + bn)
        if lo >= hi:
            return None
        spans.append((lo, hi))
    return tuple(spans)


def plan_reads(manifest: Manifest, wants: Mapping[str, Box], rank: int) -> set[int]:
    """Ranks whose shards must be read to fill ``wants`` (name -> box) plus the source rank."""
    src = source_rank(rank, manifest.world_size)
    need = {src}
    for name, want in wants.items():
        for box, (holder, _) in pieces(manifest, name, src).items():
            if _overlap(box, want) is not None:
                need.add(holder)
    return need


def assemble(manifest: Manifest, name: str, want: Box, rank: int, read: Callable[[int], Mapping[str, Any]]) -> Any:
    """A new tensor holding box ``want`` of global tensor ``name``, copied from the saved pieces.

    Args:
        manifest: The checkpoint's manifest.
        name: Tensor name.
        want: ``(offset, shape)`` in the global tensor.
        rank: The restoring rank (its source rank's pieces are preferred).
        read: Rank -> verified tensors of that rank's shard.

    Raises:
        CheckpointError: The saved pieces do not cover ``want``.
    """
    import torch

    from carina.ckpt.layout import torch_dtype

    found = pieces(manifest, name, source_rank(rank, manifest.world_size))
    if not found:
        raise CheckpointError(f"checkpoint has no pieces of tensor {name!r}", key=name)
    entry = next(iter(found.values()))[1]
    out = torch.empty(want[1], dtype=torch_dtype(entry.dtype))
    covered = 0
    for box, (holder, _) in found.items():
        spans = _overlap(box, want)
        if spans is None:
            continue
        src = read(holder)[name][tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(spans, box[0], strict=True))]
        out[tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(spans, want[0], strict=True))] = src
        covered += _volume(spans)
    if covered != out.numel():
        raise CheckpointError(
            f"saved pieces of {name!r} cover {covered} of the {out.numel()} elements asked for", key=name
        )
    return out


def _volume(spans: Iterable[tuple[int, int]]) -> int:
    n = 1
    for lo, hi in spans:
        n *= hi - lo
    return n


def wrap_like(local: Any, target: Chunk) -> Any:
    """``local`` as a DTensor placed like ``target`` (on the target's device)."""
    import torch
    from torch.distributed.tensor import DTensor

    device = target.local.device if target.local is not None else local.device
    return DTensor.from_local(
        local.to(device),
        target.mesh,
        target.placements,
        run_check=False,
        shape=torch.Size(target.global_shape),
        stride=target.stride,
    )
