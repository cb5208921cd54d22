"""The checkpoint manifest: what a committed checkpoint holds, with checksums.

One ``manifest.json`` per checkpoint directory, written last and renamed into
place with the directory, so its presence means every shard it names is durable::

    {"format": "carina.ckpt", "version": 1, "step": 120, "world_size": 1,
     "checksum": "crc32", "attempt": "5f0c2a9e41b7", "objects": {...},
     "shards": [{"rank": 0, "file": "rank00000.safetensors", "size": 8192,
                 "data_start": 4096, "header_crc32": 1234,
                 "tensors": [{"name": "model/w", "dtype": "F32", "shape": [2, 2],
                              "offset": 0, "nbytes": 16, "crc32": 99,
                              "global_shape": [4, 2], "global_offset": [2, 0]}]}]}

``offset`` is relative to ``data_start`` (safetensors convention). A tensor
that is one rank's piece of a larger one (a DTensor shard) also names the
global tensor's shape and where its piece starts in it (``global_shape``,
``global_offset``; absent or null for a rank-local tensor): restore at another
world size assembles each rank's new piece from these. The parser
trusts nothing: every field is type-checked and ranges are checked against the
shard size, so a damaged manifest raises :class:`CorruptCheckpoint` naming the field.
This module imports no torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from carina.core.errors import CorruptCheckpoint

__all__ = [
    "DTYPE_SIZES",
    "FORMAT",
    "MANIFEST_NAME",
    "VERSION",
    "Manifest",
    "ShardEntry",
    "TensorEntry",
    "parse_manifest",
    "parse_shard",
]

FORMAT = "carina.ckpt"
VERSION = 1
MANIFEST_NAME = "manifest.json"

#: safetensors dtype names and their element sizes.
DTYPE_SIZES: dict[str, int] = {
    "F64": 8, "I64": 8, "U64": 8, "C64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a shard: where its bytes are and their checksum."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc32: int
    global_shape: tuple[int, ...] | None = None
    global_offset: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ShardEntry:
    """One rank's data file (safetensors-compatible)."""

    rank: int
    file: str
    size: int
    data_start: int
    header_crc32: int
    tensors: tuple[TensorEntry, ...]


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint's table of contents."""

    step: int
    world_size: int
    shards: tuple[ShardEntry, ...]
    objects: dict[str, Any] = field(default_factory=dict)
    #: The save attempt's token (shared by every rank of that save); "" when unknown.
    attempt: str = ""
    format: str = FORMAT
    version: int = VERSION
    checksum: str = "crc32"

    @property
    def nbytes(self) -> int:
        """Total size of the shard files."""
        return sum(s.size for s in self.shards)

    def to_json(self) -> str:
        """Serialise (stable key order, so checksums of the text are reproducible)."""
        data = asdict(self)
        for shard in data["shards"]:  # rank-local tensors carry no global fields
            for t in shard["tensors"]:
                if t["global_shape"] is None:
                    del t["global_shape"], t["global_offset"]
        return json.dumps(data, indent=1, sort_keys=True, allow_nan=False)


def parse_manifest(text: str | bytes, *, path: str = "<manifest>") -> Manifest:
    """Parse and check a manifest.

    Raises:
        CorruptCheckpoint: Not JSON, wrong format/version, or any field of the
            wrong type or out of range (the message names it, ``path=`` says where).
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptCheckpoint(f"manifest is not JSON: {exc}", path=path) from exc
    check = _Checker(path)
    root = check.mapping(data, "manifest")
    fmt = check.get(root, "format", str, "manifest")
    if fmt != FORMAT:
        raise CorruptCheckpoint(f"not a carina checkpoint manifest (format {fmt!r})", path=path)
    version = check.get(root, "version", int, "manifest")
    if version != VERSION:
        raise CorruptCheckpoint(f"unsupported manifest version {version}", path=path)
    checksum = check.get(root, "checksum", str, "manifest")
    if checksum != "crc32":
        raise CorruptCheckpoint(f"unknown checksum {checksum!r}", path=path)
    step = check.natural(root, "step", "manifest")
    world = check.natural(root, "world_size", "manifest")
    if world < 1:
        raise CorruptCheckpoint("world_size must be >= 1", path=path, key="world_size")
    objects = check.mapping(root.get("objects", {}), "objects")
    attempt = check.get(root, "attempt", str, "manifest") if "attempt" in root else ""
    shard_list = check.get(root, "shards", list, "manifest")
    shards = tuple(_shard(check, s, f"shards[{i}]") for i, s in enumerate(shard_list))
    ranks = sorted(s.rank for s in shards)
    if ranks != list(range(world)):
        raise CorruptCheckpoint(f"shards cover ranks {ranks}, expected 0..{world - 1}", path=path)
    return Manifest(step=step, world_size=world, shards=shards, objects=objects, attempt=attempt)


def parse_shard(raw: Any, *, path: str = "<part>") -> ShardEntry:
    """Parse one shard entry (a rank's part file before the manifest exists).

    Raises:
        CorruptCheckpoint: As :func:`parse_manifest`.
    """
    return _shard(_Checker(path), raw, "shard")


def _shard(check: _Checker, raw: Any, where: str) -> ShardEntry:
    obj = check.mapping(raw, where)
    file = check.get(obj, "file", str, where)
    if not file or "/" in file or "\\" in file or file.startswith("."):
        raise CorruptCheckpoint(f"{where}.file is not a plain file name", path=check.path, key=where)
    size = check.natural(obj, "size", where)
    data_start = check.natural(obj, "data_start", where)
    if data_start < 8 or data_start > size:
        raise CorruptCheckpoint(f"{where}.data_start out of range", path=check.path, key=where)
    tensors = tuple(
        _tensor(check, t, f"{where}.tensors[{i}]", size - data_start)
        for i, t in enumerate(check.get(obj, "tensors", list, where))
    )
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise CorruptCheckpoint(f"{where} names a tensor twice", path=check.path, key=where)
    return ShardEntry(
        rank=check.natural(obj, "rank", where),
        file=file,
        size=size,
        data_start=data_start,
        header_crc32=check.crc(obj, "header_crc32", where),
        tensors=tensors,
    )


def _tensor(check: _Checker, raw: Any, where: str, data_bytes: int) -> TensorEntry:
    obj = check.mapping(raw, where)
    name = check.get(obj, "name", str, where)
    dtype = check.get(obj, "dtype", str, where)
    if dtype not in DTYPE_SIZES:
        raise CorruptCheckpoint(f"{where}.dtype {dtype!r} unknown", path=check.path, key=where)
    shape_raw = check.get(obj, "shape", list, where)
    shape = tuple(check.natural({"d": d}, "d", f"{where}.shape") for d in shape_raw)
    offset = check.natural(obj, "offset", where)
    nbytes = check.natural(obj, "nbytes", where)
    numel = 1
    for d in shape:
        numel *= d
    if numel * DTYPE_SIZES[dtype] != nbytes:
        raise CorruptCheckpoint(f"{where}.nbytes does not match shape and dtype", path=check.path, key=where)
    if offset + nbytes > data_bytes:
        raise CorruptCheckpoint(f"{where} runs past the end of its shard", path=check.path, key=where)
    gshape, goffset = _global(check, obj, where, shape)
    return TensorEntry(name, dtype, shape, offset, nbytes, check.crc(obj, "crc32", where), gshape, goffset)


def _global(
    check: _Checker, obj: dict[str, Any], where: str, shape: tuple[int, ...]
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """The optional ``global_shape``/``global_offset`` pair: both or neither, and the piece inside."""
    if obj.get("global_shape") is None and obj.get("global_offset") is None:
        return None, None
    dims = []
    for key in ("global_shape", "global_offset"):
        raw = check.get(obj, key, list, where)
        dims.append(tuple(check.natural({"d": d}, "d", f"{where}.{key}") for d in raw))
    gshape, goffset = dims
    if len(gshape) != len(shape) or len(goffset) != len(shape):
        raise CorruptCheckpoint(f"{where}.global_shape/global_offset rank differs", path=check.path, key=where)
    if any(o + n > g for o, n, g in zip(goffset, shape, gshape, strict=True)):
        raise CorruptCheckpoint(f"{where} lies outside its global shape", path=check.path, key=where)
    return gshape, goffset


@dataclass(frozen=True)
class _Checker:
    path: str

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise CorruptCheckpoint(f"{where} must be an object", path=self.path, key=where)
        return value

    def get(self, obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
        if key not in obj:
            raise CorruptCheckpoint(f"{where} lacks {key!r}", path=self.path, key=f"{where}.{key}")
        value = obj[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CorruptCheckpoint(f"{where}.{key} must be {kind.__name__}", path=self.path, key=f"{where}.{key}")
        return value

    def natural(self, obj: dict[str, Any], key: str, where: str) -> int:
        value: int = self.get(obj, key, int, where)
        if value < 0:
            raise CorruptCheckpoint(f"{where}.{key} is negative", path=self.path, key=f"{where}.{key}")
        return value

    def crc(self, obj: dict[str, Any], key: str, where: str) -> int:
        value = self.natural(obj, key, where)
        if value > 0xFFFFFFFF:
            raise CorruptCheckpoint(f"{where}.{key} is not a crc32", path=self.path, key=f"{where}.{key}")
        return value
