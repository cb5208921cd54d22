"""Disk image files: format sniffing, qcow2 header checks, qemu-img calls, checksummed copies.

The qcow2 header parser reads untrusted input (an image a user hands us); it refuses
what the service must never serve: backing files (they could point anywhere on the
host), external data files, encryption, and images qemu marked corrupt.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carina.core.errors import BackendUnavailable, ProvisioningError

__all__ = ["ImageFacts", "Qcow2Header", "copy_checksummed", "inspect_image", "parse_qcow2_header", "qemu_img"]

QCOW2_MAGIC = b"QFI\xfb"
_FOREIGN = {b"KDMV": "vmdk", b"vhdxfile": "vhdx", b"conectix": "vpc", b"<<< Oracle": "vdi"}
_INCOMPAT_CORRUPT = 1 << 1
_INCOMPAT_DATA_FILE = 1 << 2
_CHUNK = 4 << 20


@dataclass(frozen=True)
class Qcow2Header:
    """The fields of a qcow2 header the service relies on."""

    version: int
    backing_file_offset: int
    cluster_bits: int
    size: int
    crypt_method: int
    incompatible_features: int


def parse_qcow2_header(data: bytes, *, source: str = "<image>") -> Qcow2Header:
    """Parse and vet the first bytes of a qcow2 file.

    Raises:
        ProvisioningError: Truncated, wrong magic/version, or a feature the service refuses.
    """
    if len(data) < 72 or data[:4] != QCOW2_MAGIC:
        raise ProvisioningError("not a qcow2 image (bad magic or truncated header)", path=source)
    version, backing, _bsize, cbits, size, crypt = struct.unpack_from(">IQIIQI", data, 4)
    incompat = 0
    if version == 3:
        if len(data) < 104:
            raise ProvisioningError("qcow2 v3 header truncated", path=source)
        (incompat,) = struct.unpack_from(">Q", data, 72)
    elif version != 2:
        raise ProvisioningError(f"unsupported qcow2 version {version}", path=source)
    head = Qcow2Header(version, backing, cbits, size, crypt, incompat)
    problems = [
        (not 9 <= cbits <= 21, f"cluster_bits {cbits} out of range 9..21"),
        (size == 0, "virtual size is 0"),
        (backing != 0, "has a backing file (import a standalone image: qemu-img convert)"),
        (crypt != 0, "is encrypted"),
        (bool(incompat & _INCOMPAT_CORRUPT), "is marked corrupt"),
        (bool(incompat & _INCOMPAT_DATA_FILE), "uses an external data file"),
    ]
    for bad, why in problems:
        if bad:
            raise ProvisioningError(f"qcow2 image {why}", path=source)
    return head


def qemu_img(*args: str, timeout: float = 600) -> str:
    """Run ``qemu-img`` and return stdout; failures become ProvisioningError."""
    try:
        done = subprocess.run(["qemu-img", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise BackendUnavailable("qemu-img missing: apt-get install qemu-utils") from exc
    if done.returncode != 0:
        raise ProvisioningError(f"qemu-img {args[0]} failed: {done.stderr.strip()[:500]}", args=" ".join(args))
    return done.stdout


@dataclass(frozen=True)
class ImageFacts:
    """What :func:`inspect_image` learned about an image file."""

    format: str
    virtual_size: int
    size: int


def inspect_image(path: Path, declared: str | None = None) -> ImageFacts:
    """Identify and vet an image before anything is copied.

    Args:
        path: The file to import.
        declared: ``"raw"``, ``"qcow2"`` or None to detect from the magic.

    Raises:
        ProvisioningError: Missing/unreadable file, unsupported or corrupt image,
            or a declared format that contradicts the file.
    """
    if not path.is_file():
        raise ProvisioningError("image file not found", path=str(path))
    with path.open("rb") as fh:
        head = fh.read(4096)
    size = path.stat().st_size
    detected = "qcow2" if head[:4] == QCOW2_MAGIC else _foreign(head) or "raw"
    if detected not in ("raw", "qcow2"):
        raise ProvisioningError(f"{detected} images are not supported (raw or qcow2)", path=str(path))
    fmt = declared or detected
    if fmt not in ("raw", "qcow2"):
        raise ProvisioningError(f"unknown format {fmt!r} (raw or qcow2)", path=str(path))
    if fmt != detected:
        raise ProvisioningError(f"file is {detected}, not {fmt}", path=str(path))
    if fmt == "raw":
        if size == 0 or size % 512:
            raise ProvisioningError(f"raw image size {size} is not a positive multiple of 512", path=str(path))
        return ImageFacts("raw", size, size)
    parse_qcow2_header(head, source=str(path))
    _check_qcow2(path)
    info: dict[str, Any] = json.loads(qemu_img("info", "--output=json", "-f", "qcow2", str(path)))
    if info.get("backing-filename") or info.get("format") != "qcow2":
        raise ProvisioningError("qcow2 image has a backing file", path=str(path))
    return ImageFacts("qcow2", int(info["virtual-size"]), size)


def _foreign(head: bytes) -> str | None:
    return next((name for magic, name in _FOREIGN.items() if head.startswith(magic)), None)


def _check_qcow2(path: Path) -> None:
    done = subprocess.run(
        ["qemu-img", "check", "-f", "qcow2", "--output=json", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:  # 1 check failed, 2 corruptions, 3 leaks (harmless but refuse too)
        detail = (done.stderr.strip() or done.stdout.strip())[:300]
        raise ProvisioningError(f"qcow2 image failed qemu-img check: {detail}", path=str(path))


def copy_checksummed(src: Path, dest: Path, *, expect_sha256: str | None = None) -> str:
    """Copy ``src`` to ``dest`` atomically (temp file, fsync, rename); return its SHA-256.

    Holes in ``src`` stay holes. On any failure, including a checksum mismatch,
    nothing is left at ``dest``.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
    digest = hashlib.sha256()
    zero = bytes(_CHUNK)
    try:
        with src.open("rb") as fin, tmp.open("wb") as fout:
            while chunk := fin.read(_CHUNK):
                digest.update(chunk)
                if chunk == zero[: len(chunk)]:
                    fout.seek(len(chunk), os.SEEK_CUR)
                else:
                    fout.write(chunk)
            fout.truncate()
            fout.flush()
            os.fsync(fout.fileno())
        sha = digest.hexdigest()
        if expect_sha256 and sha != expect_sha256.lower():
            raise ProvisioningError(f"checksum mismatch: expected {expect_sha256}, got {sha}", path=str(src))
        if dest.exists():
            raise ProvisioningError("an image file already exists there", path=str(dest))
        tmp.rename(dest)
        _fsync_dir(dest.parent)
        return sha
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
