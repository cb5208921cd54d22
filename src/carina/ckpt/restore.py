"""Read back what one rank restores, at the saved world size or another one.

The target state (the objects :meth:`Checkpointer.restore` is given) says what
each tensor should look like now: a DTensor target names its mesh, placements
and therefore the box of the global tensor this rank holds; a plain target
takes the whole tensor. Saved DTensor pieces are assembled into those boxes
(:mod:`carina.ckpt.reshard`); rank-local values (small state, RNG states, plain
tensors) come from the source rank, ``rank mod saved world size``.

An optimizer whose state is still empty (no step taken yet) gets the placement
of each parameter for that parameter's saved state of the same global shape,
so a fresh FSDP2 optimizer can be restored into directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carina.ckpt.manifest import Manifest
from carina.ckpt.reshard import Box, Chunk, assemble, chunk_of, plan_reads, source_rank, wrap_like
from carina.ckpt.storage import Source, select_shards
from carina.ckpt.tree import flatten, unflatten
from carina.core.errors import CheckpointError

__all__ = ["load_for_rank", "targets"]


def targets(state: Mapping[str, Any]) -> dict[str, Chunk]:
    """Tensor name -> the :class:`Chunk` a DTensor in the target state occupies.

    Optimizers add ``<key>/state/<pid>/*`` entries: the placement of parameter
    ``pid``, used for its saved state when the optimizer has none yet.
    """
    import torch

    out: dict[str, Chunk] = {}
    for key, value in state.items():
        current = value.state_dict() if hasattr(value, "load_state_dict") else value
        try:
            flatten({key: current}, chunks=out)
        except CheckpointError:
            continue  # a target value that could not be saved says nothing about placements
        if isinstance(value, torch.optim.Optimizer):
            params = [p for group in value.param_groups for p in group["params"]]
            for pid, param in enumerate(params):
                chunk = chunk_of(param, f"{key}/state/{pid}")
                if chunk is not None:
                    out[f"{key}/state/{pid}/*"] = chunk
    return out


def _target(name: str, global_shape: tuple[int, ...], chunks: Mapping[str, Chunk]) -> Chunk | None:
    chunk = chunks.get(name)
    if chunk is None:
        chunk = chunks.get(name.rpartition("/")[0] + "/*")
        if chunk is not None and chunk.global_shape != global_shape:
            return None  # e.g. a scalar "step" next to per-element state
    elif chunk.global_shape != global_shape:
        raise CheckpointError(
            f"tensor {name!r} is {global_shape} in the checkpoint, {chunk.global_shape} in the target", key=name
        )
    return chunk


def _wants(manifest: Manifest, chunks: Mapping[str, Chunk], rank: int) -> dict[str, tuple[Box, Chunk | None]]:
    """For every saved DTensor piece the source rank names: the box this rank needs, and its target."""
    src = source_rank(rank, manifest.world_size)
    shard = next(s for s in manifest.shards if s.rank == src)
    out: dict[str, tuple[Box, Chunk | None]] = {}
    for t in shard.tensors:
        if t.global_shape is None:
            continue
        target = _target(t.name, t.global_shape, chunks)
        whole = ((0,) * len(t.global_shape), t.global_shape)
        out[t.name] = (target.box if target is not None else whole, target)
    return out


def load_for_rank(root: str | Source, state: Mapping[str, Any], rank: int, step: int | None) -> tuple[Manifest, Any]:
    """Select, verify and assemble the newest good checkpoint for ``rank``.

    ``root`` is a local checkpoint directory or a :class:`~carina.ckpt.storage.Source`
    (a :class:`~carina.ckpt.remote.RemoteStore`): only the shards this rank needs are read.

    Returns:
        The manifest and the saved state tree with tensors (DTensors where the
        target has them) filled in.

    Raises:
        CheckpointError: Nothing to restore, or the saved pieces do not fit the target.
        CorruptCheckpoint: ``step`` was named and fails verification.
    """
    chunks = targets(state)

    def boxes(m: Manifest) -> dict[str, Box]:
        return {name: box for name, (box, _) in _wants(m, chunks, rank).items()}

    manifest, shards = select_shards(root, lambda m: plan_reads(m, boxes(m), rank), step)
    src = source_rank(rank, manifest.world_size)
    wants = _wants(manifest, chunks, rank)
    tensors: dict[str, Any] = {}
    for name, value in shards[src].items():
        if name in wants:
            box, target = wants[name]
            local = assemble(manifest, name, box, rank, shards.__getitem__)
            tensors[name] = local if target is None else wrap_like(local, target)
        else:
            tensors[name] = _plain(name, value, chunks)
    return manifest, unflatten(manifest.objects.get(str(src)), tensors)


def _plain(name: str, value: Any, chunks: Mapping[str, Chunk]) -> Any:
    """A rank-local saved tensor; a whole tensor saved for a DTensor target is cut to this rank's box."""
    target = chunks.get(name)
    if target is None:
        star = chunks.get(name.rpartition("/")[0] + "/*")  # a fresh optimizer: its parameter's placement
        if star is None or star.global_shape != tuple(value.shape):
            return value
        target = star
    if tuple(value.shape) != target.global_shape:
        raise CheckpointError(
            f"tensor {name!r} was saved as a plain {tuple(value.shape)} tensor; the target is a "
            f"DTensor of global shape {target.global_shape}",
            key=name,
        )
    box = tuple(slice(o, o + n) for o, n in zip(target.offset, target.shape, strict=True))
    return wrap_like(value[box].clone(), target)
