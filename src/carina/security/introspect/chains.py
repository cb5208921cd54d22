"""qcow2 backing chains, resolved by carina under a policy, then handed to dissect as one stream.

dissect resolves a backing file only by *name* next to the image, so chains
with absolute backing paths (what ``qemu-img create -b /abs/base.qcow2`` and
most provisioning tools write) fail to open. carina reads each header itself,
checks the backing path against a :class:`BackingPolicy`, detects loops and
opens every layer read-only.
"""

from __future__ import annotations

import enum
import struct
from pathlib import Path
from typing import Any, BinaryIO

from carina.core.errors import ModelFormatError

__all__ = ["BackingPolicy", "backing_file", "open_chain"]

QCOW2_MAGIC = b"QFI\xfb"
MAX_DEPTH = 32


class BackingPolicy(enum.Enum):
    """Which backing files a qcow2 image may name."""

    SAME_DIR = "same-dir"  # only files inside the image's own directory (default)
    ANY = "any"  # any readable file (trust the image's metadata)
    DENY = "deny"  # no backing files: chains are refused


def backing_file(path: Path) -> str | None:
    """The backing file name recorded in a qcow2 header, or None.

    Raises:
        ModelFormatError: The header is truncated or the name is not UTF-8.
    """
    with path.open("rb") as fh:
        head = fh.read(20)
        if len(head) < 20 or head[:4] != QCOW2_MAGIC:
            raise ModelFormatError("not a qcow2 image (bad magic or truncated header)", file=str(path))
        offset, size = struct.unpack(">QI", head[8:20])
        if not offset:
            return None
        if size == 0 or size > 1023:
            raise ModelFormatError(f"qcow2 backing file name of {size} bytes", file=str(path))
        fh.seek(offset)
        raw = fh.read(size)
    try:
        if len(raw) != size:
            raise UnicodeDecodeError("utf-8", raw, 0, len(raw), "truncated")
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ModelFormatError("qcow2 backing file name unreadable", file=str(path)) from exc


def _resolve(image: Path, name: str, policy: BackingPolicy) -> Path:
    if policy is BackingPolicy.DENY:
        raise ModelFormatError(f"backing file {name!r} refused (policy deny)", file=str(image))
    target = (image.parent / name).resolve()
    if policy is BackingPolicy.SAME_DIR and target.parent != image.resolve().parent:
        raise ModelFormatError(
            f"backing file {name!r} lies outside the image's directory (policy same-dir)", file=str(image)
        )
    if not target.is_file():
        raise ModelFormatError(f"backing file {name!r} not found", file=str(image))
    return target


def open_chain(path: Path, policy: BackingPolicy, *, _seen: frozenset[Path] = frozenset()) -> BinaryIO:
    """A read-only stream of the virtual disk of qcow2 ``path`` with its whole backing chain.

    Raises:
        ModelFormatError: A loop, a chain deeper than 32, a refused or missing backing file.
    """
    from dissect.hypervisor.disk.qcow2 import QCow2

    real = path.resolve()
    if real in _seen or len(_seen) >= MAX_DEPTH:
        raise ModelFormatError("qcow2 backing chain loops or is deeper than 32 layers", file=str(path))
    name = backing_file(path)
    backing: Any = None
    if name is not None:
        parent = _resolve(path, name, policy)
        with parent.open("rb") as probe:
            is_qcow2 = probe.read(4) == QCOW2_MAGIC
        backing = open_chain(parent, policy, _seen=_seen | {real}) if is_qcow2 else parent.open("rb")
    fh = path.open("rb")
    try:
        stream: BinaryIO = QCow2(fh, backing_file=backing).open()
        return stream
    except Exception as exc:
        fh.close()
        raise ModelFormatError(f"cannot read qcow2: {type(exc).__name__}: {exc}", file=str(path)) from exc
