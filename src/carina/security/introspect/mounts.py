"""Assemble an image's filesystems into one tree the way its ``/etc/fstab`` says.

A root partition often leaves ``/usr``, ``/var`` or ``/home`` to other
partitions or LVM logical volumes. :func:`parse_fstab` reads fstab(5) as
util-linux does (whitespace-separated fields, ``#`` comment lines, octal
escapes such as ``\\040`` for a space, fields 3 to 6 optional);
:func:`match_device` finds the filesystem an entry names (``UUID=``,
``LABEL=``, ``PARTUUID=``, ``PARTLABEL=``, their ``/dev/disk/by-*`` forms,
``/dev/mapper/VG-LV``, ``/dev/VG/LV``, ``/dev/sda2``-style partition
numbers); :class:`MountTable` resolves paths across the mounts, following
symlinks component by component (a merged-/usr ``/lib -> usr/lib`` lands on
the ``/usr`` filesystem), never outside the image's root, with Linux's limit
of 40 symlinks per lookup.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FsIdentity", "FstabEntry", "MountTable", "identify", "match_device", "parse_fstab", "wanted"]

MAX_LINKS = 40
# Not block devices in the image: nothing to mount from it.
PSEUDO = frozenset(
    {
        *("swap", "tmpfs", "proc", "sysfs", "devpts", "devtmpfs", "cgroup", "cgroup2", "securityfs", "debugfs"),
        *("tracefs", "mqueue", "hugetlbfs", "efivarfs", "pstore", "bpf", "configfs", "fusectl", "binfmt_misc"),
        *("overlay", "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse", "sshfs", "none", "iso9660", "udf"),
    }
)
_OCTAL = re.compile(r"\\([0-7]{3})")
_BLANKS = re.compile(r"[ \t]+")
_INT = re.compile(r"[+-]?[0-9]+")
_PARTITION = re.compile(r"^/dev/(?:(?:[shv]d|xvd)[a-z]+|(?:nvme\d+n|mmcblk|loop)\d+p)(\d+)$")


@dataclass(frozen=True)
class FstabEntry:
    """One fstab line: ``spec file vfstype options freq passno``."""

    spec: str
    file: str
    vfstype: str = "auto"
    options: tuple[str, ...] = ()
    freq: int = 0
    passno: int = 0
    line: int = 0


def _unescape(field_: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field_)


def parse_fstab(text: str) -> tuple[list[FstabEntry], list[str]]:
    """Parse fstab(5) text into entries and one message per malformed line (which is skipped).

    Follows libmount (util-linux 2.38): fields split on spaces and tabs, lines
    whose first non-blank character is ``#`` are comments, at least three fields,
    ``freq`` and ``passno`` optional integers, anything after the sixth field
    ignored, ``\\ooo`` octal escapes decoded in every text field. Never raises:
    an fstab inside an image is untrusted input.
    """
    entries: list[FstabEntry] = []
    errors: list[str] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        fields = _BLANKS.split(line)
        numbers = fields[4:6]
        if len(fields) < 3 or not all(_INT.fullmatch(f) for f in numbers):
            errors.append(f"line {number}: not 'spec file type [options [freq [passno]]]'")
            continue
        freq, passno = (int(f) for f in [*numbers, "0", "0"][:2])
        spec, file, vfstype = (_unescape(f) for f in fields[:3])
        options = tuple(_unescape(fields[3]).split(",")) if len(fields) > 3 else ()
        entries.append(FstabEntry(spec, file, vfstype, options, freq, passno, number))
    return entries, errors


def wanted(entry: FstabEntry) -> str | None:
    """The normalised mount point of an entry carina mounts, or None for one it skips.

    Skipped: the root itself, swap and pseudo/network filesystems, ``bind`` and
    ``noauto`` entries, and mount points that are not absolute paths.
    """
    if entry.vfstype in PSEUDO or {"bind", "rbind", "noauto"} & set(entry.options):
        return None
    if not entry.file.startswith("/") or "\0" in entry.file:
        return None
    mount = posixpath.normpath(entry.file)
    mount = "/" + mount.lstrip("/")  # normpath keeps a leading '//'
    return None if mount == "/" else mount


@dataclass(frozen=True)
class FsIdentity:
    """The names a filesystem can be given in fstab."""

    uuid: str = ""
    label: str = ""
    partuuid: str = ""
    partlabel: str = ""
    lv: tuple[str, str] | None = None  # (volume group, logical volume)
    partno: int = 0


def identify(fs: Any) -> FsIdentity:
    """Read the identity of a dissect filesystem (UUID and label from its superblock, volume names)."""
    uuid = label = ""
    kind = getattr(fs, "__type__", "")
    if kind == "ext":
        uuid, label = str(fs.extfs.uuid), str(fs.extfs.volume_name or "")
    elif kind == "xfs":
        uuid, label = str(fs.xfs.uuid), str(fs.xfs.name or "")
    vol = getattr(fs, "volume", None)
    name = str(getattr(vol, "name", "") or "")
    if type(getattr(vol, "vs", None)).__name__ == "LvmVolumeSystem":
        vg, _, lv = re.sub(r"(?<!-)-(?!-)", "\0", name).partition("\0")
        return FsIdentity(uuid=uuid, label=label, lv=(vg.replace("--", "-"), lv.replace("--", "-")))
    guid = getattr(vol, "guid", None)
    return FsIdentity(
        uuid=uuid,
        label=label,
        partuuid=str(guid) if guid else "",
        partlabel=name,
        partno=int(getattr(vol, "number", 0) or 0),
    )


_TAGS = {"UUID": "uuid", "LABEL": "label", "PARTUUID": "partuuid", "PARTLABEL": "partlabel"}
_BY = {"by-uuid": "uuid", "by-label": "label", "by-partuuid": "partuuid", "by-partlabel": "partlabel"}


def match_device(spec: str, ident: FsIdentity) -> bool:
    """Whether fstab's first field ``spec`` names the filesystem with identity ``ident``."""
    tag, eq, value = spec.partition("=")
    if eq and tag in _TAGS:
        attr, value = _TAGS[tag], value.strip("\"'")
    elif spec.startswith("/dev/disk/") and spec.count("/") == 4:
        kind, value = spec.split("/")[3:5]
        if kind not in _BY:
            return False
        attr = _BY[kind]
    elif spec.startswith("/dev/mapper/") and ident.lv is not None:
        vg, lv = ident.lv
        return spec[len("/dev/mapper/") :] == f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"
    elif (m := _PARTITION.match(spec)) is not None:
        return ident.lv is None and ident.partno == int(m.group(1))
    elif spec.startswith("/dev/") and spec.count("/") == 3 and ident.lv is not None:
        return tuple(spec.split("/")[2:4]) == ident.lv
    else:
        return False
    have = str(getattr(ident, attr))
    if not value or not have:
        return False
    return have.lower() == value.lower() if attr in ("uuid", "partuuid") else have == value


@dataclass
class MountTable:
    """A root filesystem plus filesystems mounted on paths below it (dissect filesystems)."""

    root: Any
    mounts: dict[str, Any] = field(default_factory=dict)

    def locate(self, path: str) -> tuple[Any, str]:
        """The filesystem that holds the already-resolved absolute ``path``, and the path inside it."""
        best = ""
        for mount in self.mounts:
            if (path == mount or path.startswith(mount + "/")) and len(mount) > len(best):
                best = mount
        if not best:
            return self.root, path
        return self.mounts[best], path[len(best) :] or "/"

    def resolve(self, path: str, *, follow_last: bool = True) -> str:
        """Resolve symlinks in ``path`` across mounts (``..`` stops at ``/``).

        Raises:
            FileNotFoundError: A component does not exist.
            OSError: More than 40 symlinks (a loop).
        """
        todo = [p for p in path.split("/") if p][::-1]
        done: list[str] = []
        links = 0
        while todo:
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join([*done, name])
            if not todo and not follow_last:
                done.append(name)
                break
            fs, inner = self.locate(here)
            entry = fs.get(inner)
            if not entry.is_symlink():
                done.append(name)
                continue
            links += 1
            if links > MAX_LINKS:
                raise OSError(f"{path}: too many levels of symbolic links")
            target = entry.readlink()
            if target.startswith("/"):
                done = []
            todo.extend(p for p in reversed(target.split("/")) if p)
        return "/" + "/".join(done)

    def get(self, path: str, *, follow_last: bool = True) -> Any:
        """The dissect entry at ``path`` (symlinks resolved across mounts)."""
        fs, inner = self.locate(self.resolve(path, follow_last=follow_last))
        return fs.get(inner)
