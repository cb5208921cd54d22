"""Where each tensor's bytes go: the safetensors-compatible layout of a shard.

A shard file is ``[8-byte little-endian header length][JSON header, space padded]
[tensor bytes]``: exactly what ``safetensors.safe_open`` reads. The header is
padded so the data starts on a 4096-byte boundary (O_DIRECT friendly), and
tensors are packed widest element first, so every tensor stays naturally aligned
and the arena that stages them is a byte-for-byte image of the file.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from carina.ckpt.manifest import DTYPE_SIZES
from carina.core.errors import CheckpointError

__all__ = ["ALIGN", "Layout", "Slot", "dtype_name", "plan_layout", "torch_dtype"]

ALIGN = 4096

_TORCH_NAMES = {
    "float64": "F64", "int64": "I64", "uint64": "U64", "complex64": "C64",
    "float32": "F32", "int32": "I32", "uint32": "U32",
    "float16": "F16", "bfloat16": "BF16", "int16": "I16", "uint16": "U16",
    "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}  # fmt: skip
_SHORT_NAMES = {v: k for k, v in _TORCH_NAMES.items()}


def dtype_name(dtype: Any) -> str:
    """The safetensors name of a torch dtype.

    Raises:
        CheckpointError: The dtype has no safetensors name.
    """
    short = str(dtype).removeprefix("torch.")
    if short not in _TORCH_NAMES:
        raise CheckpointError(f"cannot checkpoint tensors of dtype {dtype}", key=short)
    return _TORCH_NAMES[short]


def torch_dtype(name: str) -> Any:
    """The torch dtype of a safetensors dtype name."""
    import torch

    return getattr(torch, _SHORT_NAMES[name])


@dataclass(frozen=True)
class Slot:
    """One tensor's place in the shard: ``offset`` is relative to the data start."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """The header bytes and tensor slots of one shard."""

    header: bytes  # length prefix + padded JSON header; len(header) == data_start
    slots: tuple[Slot, ...]

    @property
    def data_start(self) -> int:
        """Offset of the first tensor byte in the file."""
        return len(self.header)

    @property
    def size(self) -> int:
        """Total file size."""
        return self.data_start + sum(s.nbytes for s in self.slots)

    def signature(self) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """What the layout depends on: names, dtypes, shapes (equal signatures, equal layouts)."""
        return tuple((s.name, s.dtype, s.shape) for s in self.slots)


def plan_layout(specs: list[tuple[str, str, tuple[int, ...]]]) -> Layout:
    """Lay out tensors given as ``(name, dtype_name, shape)``.

    Raises:
        CheckpointError: Duplicate names or an unknown dtype.
    """
    names = [n for n, _, _ in specs]
    if len(set(names)) != len(names):
        raise CheckpointError("two tensors share a name", key=sorted(n for n in names if names.count(n) > 1)[0])
    order = sorted(specs, key=lambda s: (-DTYPE_SIZES[s[1]], s[0]))
    slots: list[Slot] = []
    offset = 0
    for name, dtype, shape in order:
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * DTYPE_SIZES[dtype]
        slots.append(Slot(name, dtype, tuple(shape), offset, nbytes))
        offset += nbytes
    return Layout(header=_header(slots), slots=tuple(slots))


def _header(slots: list[Slot]) -> bytes:
    meta: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "carina.ckpt"}}
    for s in slots:
        meta[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [s.offset, s.offset + s.nbytes]}
    body = json.dumps(meta, separators=(",", ":")).encode()
    total = -(-(8 + len(body)) // ALIGN) * ALIGN
    body += b" " * (total - 8 - len(body))
    return struct.pack("<Q", len(body)) + body
