"""Where every parameter's bytes live in the shared segment, and which PS shard owns it.

One file in a tmpfs holds, for each parameter (in model order): the fp32 master (written by
its PS shard), its optimizer state (AdamW's step count and two moments, fp32), the published
copy (PS writes, workers read) and one gradient slot per worker (that worker writes, the PS
reads). Both sides map the same file, so no byte is serialised; because the whole PS state is
in the file, the launching process can snapshot it at a step boundary (checkpoints) and write
a restored one before any shard starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carina.core.errors import CapacityError, ConfigError

__all__ = ["ParamSlot", "SharedLayout", "assign_shards", "publish_order"]

_ALIGN = 64


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class ParamSlot:
    """Offsets (bytes) of one parameter's regions in the shared file."""

    name: str
    shape: tuple[int, ...]
    numel: int
    shard: int
    master: int
    published: int
    grads: tuple[int, ...]  # one per worker
    state: tuple[int, ...] = ()  # AdamW: (step scalar, exp_avg, exp_avg_sq); SGD: none


def assign_shards(sizes: Sequence[int], shards: int) -> list[int]:
    """Greedy largest-first assignment of parameters to the least-loaded shard (deterministic)."""
    load = [0] * shards
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(shards), key=lambda s: (load[s], s))
        owner[index] = target
        load[target] += sizes[index]
    return owner


@dataclass(frozen=True)
class SharedLayout:
    """The whole segment: parameter slots and total size."""

    slots: tuple[ParamSlot, ...]
    workers: int
    publish_itemsize: int
    nbytes: int

    @classmethod
    def plan(
        cls,
        params: Sequence[tuple[str, tuple[int, ...]]],
        *,
        workers: int,
        shards: int,
        publish_itemsize: int,
        moments: int = 0,
    ) -> SharedLayout:
        """Lay out ``params`` (name, shape) for ``workers`` and ``shards``.

        ``moments`` fp32 optimizer-state tensors per parameter (2 for AdamW) follow a step
        scalar; with ``moments=0`` there is no optimizer state (plain SGD).
        """
        if not params:
            raise ConfigError("the model has no trainable parameters", key="model")
        numels = [_numel(shape) for _, shape in params]
        owners = assign_shards(numels, shards)
        offset, slots = 0, []
        for (name, shape), numel, shard in zip(params, numels, owners, strict=True):
            master = offset
            offset = _align(offset + 4 * numel)
            published = offset
            offset = _align(offset + publish_itemsize * numel)
            grads = []
            for _ in range(workers):
                grads.append(offset)
                offset = _align(offset + 4 * numel)
            state = []
            if moments:
                state.append(offset)
                offset = _align(offset + 4)
                for _ in range(moments):
                    state.append(offset)
                    offset = _align(offset + 4 * numel)
            slots.append(ParamSlot(name, tuple(shape), numel, shard, master, published, tuple(grads), tuple(state)))
        return cls(tuple(slots), workers, publish_itemsize, offset)

    def check_fits(self, directory: Path) -> None:
        """Refuse, before anything starts, a segment larger than the tmpfs can hold."""
        import shutil

        free = shutil.disk_usage(directory).free
        if self.nbytes > free:
            raise CapacityError(
                f"shared segment needs {self.nbytes / 2**30:.2f} GiB, {directory} has {free / 2**30:.2f} GiB free",
                path=str(directory),
            )

    def shard_slots(self, shard: int) -> list[ParamSlot]:
        """The slots one PS shard owns, in model order."""
        return [s for s in self.slots if s.shard == shard]


def publish_order(names: Sequence[str]) -> list[int]:
    """Indices of ``names`` in the order a worker's next forward needs them.

    carina.offload's runtime fetches the non-block parameters (embeddings, final norm, head)
    when the forward starts, then the repeated blocks in order: names with no integer path
    component come first (in model order), then those with one, by that block index. The order
    only decides how soon each update is published, never what it is.
    """

    def key(i: int) -> tuple[int, int, int]:
        block = next((int(part) for part in names[i].split(".") if part.isdigit()), None)
        return (0, 0, i) if block is None else (1, block, i)

    return sorted(range(len(names)), key=key)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def map_segment(path: Path, nbytes: int, *, create: bool) -> Any:
    """Map the shared file as a flat uint8 tensor (created zero-filled when ``create``)."""
    import torch

    if create:
        with path.open("wb") as fh:
            fh.truncate(nbytes)
    return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)


def view(segment: Any, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """A typed tensor view of ``segment`` at ``offset``."""
    import torch

    itemsize = torch.empty(0, dtype=dtype).element_size()
    numel = _numel(shape)
    return segment[offset : offset + itemsize * numel].view(dtype).view(shape)
