"""Read-only access to the filesystem inside a disk image, through dissect.target.

dissect.target (AGPL-3.0, the optional ``security`` extra) opens raw, qcow2
(backing chains included), VMDK (streamOptimized included) and VHD(X)
containers, MBR/GPT and LVM2 volumes, and ext2/3/4, XFS, btrfs and more,
entirely in user space: nothing is mounted and every file is opened ``rb``.
Paths are resolved inside the image's own virtual root, so no symlink can lead
to the host. Every read is bounded; whatever the image's parsers choke on
becomes a warning, and the scan is marked partial.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core.errors import BackendUnavailable, ModelFormatError
from carina.security.introspect.chains import QCOW2_MAGIC, BackingPolicy, open_chain
from carina.security.introspect.mounts import MountTable, identify, match_device, parse_fstab, wanted

__all__ = ["Entry", "ImageView", "open_image"]


@dataclass(frozen=True)
class Entry:
    """One file system entry seen by a walk (``lstat`` data, symlinks not followed)."""

    path: str
    mode: int
    uid: int
    gid: int
    size: int


@dataclass
class ImageView:
    """The root filesystem of one opened image; reads are bounded and never write.

    Attributes:
        source: The image path as given.
        root: The dissect filesystem that holds ``/etc``.
        max_file_bytes: Largest file read whole; longer ones are cut and reported.
        max_entries: Most entries a walk visits before it stops and reports.
        warnings: What could not be read (the scan is partial when non-empty).
        volumes: Filesystem types found in the image, in order.
        mounts: Filesystems mounted below the root by its ``/etc/fstab`` (mount point -> filesystem).
    """

    source: str
    root: Any
    max_file_bytes: int = 16 << 20
    max_entries: int = 500_000
    warnings: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    host_root: str = ""
    mounts: dict[str, Any] = field(default_factory=dict)

    def _escapes(self, path: str) -> bool:
        """For a plain root directory: does ``path`` resolve (through host symlinks) outside it?"""
        if not self.host_root:
            return False
        real = os.path.realpath(os.path.join(self.host_root, path.lstrip("/")))
        if real == self.host_root or real.startswith(self.host_root + os.sep):
            return False
        self.warn(f"{path}: resolves outside the root directory; not read")
        return True

    def warn(self, msg: str) -> None:
        """Record something that could not be read."""
        if len(self.warnings) < 1000:
            self.warnings.append(msg)

    def _path(self, path: str) -> Any:
        if not self.mounts:
            return self.root.path(path)
        table = MountTable(self.root, self.mounts)
        fs, inner = table.locate(table.resolve(path))
        return fs.path(inner)

    def _entry(self, path: str) -> Any:
        """The dissect entry at ``path`` (final symlink not followed)."""
        if not self.mounts:
            return self.root.get(path)
        return MountTable(self.root, self.mounts).get(path, follow_last=False)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (following symlinks inside the image)."""
        try:
            return bool(self._path(path).exists())
        except Exception:  # noqa: BLE001  (hostile image: any parser error means "unreadable")
            return False

    def read_bytes(self, path: str) -> bytes | None:
        """The bytes of ``path`` (at most ``max_file_bytes``), or None if absent/unreadable."""
        if self._escapes(path):
            return None
        try:
            p = self._path(path)
            if not p.is_file():
                return None
            with p.open("rb") as fh:
                data = fh.read(self.max_file_bytes + 1)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001
            self.warn(f"{path}: unreadable ({type(exc).__name__}: {exc})")
            return None
        if len(data) > self.max_file_bytes:
            self.warn(f"{path}: larger than {self.max_file_bytes} bytes, read truncated")
            return data[: self.max_file_bytes]
        return bytes(data)

    def read_text(self, path: str) -> str | None:
        """``read_bytes`` decoded as UTF-8 (undecodable bytes replaced)."""
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8", "replace")

    def listdir(self, path: str) -> list[str]:
        """Names in directory ``path`` (empty if absent or unreadable)."""
        if self._escapes(path):
            return []
        try:
            p = self._path(path)
            if not p.is_dir():
                return []
            return sorted(c.name for c in p.iterdir())
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            self.warn(f"{path}: cannot list ({type(exc).__name__}: {exc})")
            return []

    def lstat(self, path: str) -> Entry | None:
        """``lstat`` of ``path``, or None."""
        try:
            st = self._entry(path).lstat()
        except Exception:  # noqa: BLE001
            return None
        return Entry(path, int(st.st_mode), int(st.st_uid), int(st.st_gid), int(st.st_size))

    def walk(self, top: str = "/", *, skip: tuple[str, ...] = ("/proc", "/sys", "/dev")) -> Iterator[Entry]:
        """Every entry below ``top`` (depth first, symlinks not followed), up to ``max_entries``.

        Walks dissect's directory entries directly, so each directory is read
        once (resolving every child's full path would re-read its parents).
        """
        try:
            stack = [(top, self._entry(top))]
        except Exception as exc:  # noqa: BLE001
            self.warn(f"{top}: cannot walk ({type(exc).__name__})")
            return
        seen = 0
        while stack:
            folder, entry = stack.pop()
            try:
                children = sorted(entry.scandir(), key=lambda c: c.name)
            except Exception as exc:  # noqa: BLE001
                self.warn(f"{folder}: cannot list ({type(exc).__name__}: {exc})")
                continue
            for child in children:
                path = f"{folder.rstrip('/')}/{child.name}"
                mounted = self.mounts.get(path)
                # A mounted filesystem's root hides the directory it is mounted on.
                found = _root_stat(mounted, path, self) if mounted is not None else _child_stat(child, path)
                if found is None:
                    continue
                seen += 1
                if seen > self.max_entries:
                    self.warn(f"walk stopped after {self.max_entries} entries")
                    return
                yield found
                if stat.S_ISDIR(found.mode) and path not in skip:
                    try:
                        stack.append((path, mounted.get("/") if mounted is not None else child.get()))
                    except Exception as exc:  # noqa: BLE001
                        self.warn(f"{path}: cannot open ({type(exc).__name__})")


_EXT_INODE = struct.Struct("<HHI16xH82xI8xHH")  # mode, uid, size_lo, gid, size_high, uid_high, gid_high


def _ext_stat(child: Any, path: str) -> Entry | None:
    """Mode/owner/size of an ext2/3/4 directory entry read straight from its inode (128 bytes).

    dissect parses the whole inode structure in pure Python (~0.5 ms each); this
    reads only the fields a walk needs. Returns None when ``child`` is not ext.
    """
    inode: Any = getattr(child, "entry", None)
    extfs = getattr(inode, "extfs", None)
    inum = getattr(inode, "inum", None)
    if extfs is None or not isinstance(inum, int):
        return None
    group, index = divmod(inum - 1, extfs.sb.s_inodes_per_group)
    desc = extfs._read_group_desc(group)
    table = (getattr(desc, "bg_inode_table_hi", 0) << 32) | desc.bg_inode_table_lo
    extfs.fh.seek(table * extfs.block_size + index * extfs.sb.s_inode_size)
    raw = extfs.fh.read(_EXT_INODE.size)
    if len(raw) < _EXT_INODE.size:
        raise EOFError(f"inode {inum} truncated")
    mode, uid, size_lo, gid, size_hi, uid_hi, gid_hi = _EXT_INODE.unpack(raw)
    return Entry(path, mode, uid | uid_hi << 16, gid | gid_hi << 16, size_lo | size_hi << 32)


def _child_stat(child: Any, path: str) -> Entry | None:
    try:
        fast = _ext_stat(child, path)
        if fast is not None:
            return fast
        st = child.stat(follow_symlinks=False)
    except Exception:  # noqa: BLE001  (an unreadable inode is skipped)
        return None
    return Entry(path, int(st.st_mode), int(st.st_uid), int(st.st_gid), int(st.st_size))


def _root_stat(fs: Any, path: str, view: ImageView) -> Entry | None:
    try:
        st = fs.get("/").lstat()
    except Exception as exc:  # noqa: BLE001
        view.warn(f"{path}: mounted filesystem unreadable ({type(exc).__name__})")
        return None
    return Entry(path, int(st.st_mode), int(st.st_uid), int(st.st_gid), int(st.st_size))


def _is_qcow2(p: Path) -> bool:
    if not p.is_file():
        return False
    with p.open("rb") as fh:
        return fh.read(4) == QCOW2_MAGIC


def _filesystems(p: Path, backing: BackingPolicy) -> list[Any]:
    """Every filesystem dissect finds in ``p``: containers, then volume systems (MBR/GPT/LVM)."""
    from dissect.target import container
    from dissect.target.containers.raw import RawContainer
    from dissect.target.filesystems.dir import DirectoryFilesystem
    from dissect.target.target import Target

    if p.is_dir():
        return [DirectoryFilesystem(p)]
    # Only disks, volumes and filesystems: OS plugin detection (seconds of imports) is not needed.
    target = Target(p)
    disk = RawContainer(open_chain(p, backing)) if _is_qcow2(p) else container.open(p)
    target.disks.add(disk)
    target.disks.apply()
    target.volumes.apply()
    return list(target.filesystems)


def _root_of(filesystems: list[Any]) -> Any:
    """The filesystem holding ``/etc`` (the root), else the first one."""
    for fs in filesystems:
        try:
            if fs.path("/etc").is_dir():
                return fs
        except Exception:  # noqa: BLE001  (a corrupt volume is skipped, not fatal)
            continue
    return filesystems[0]


def _assemble(view: ImageView, filesystems: list[Any]) -> None:
    """Mount the filesystems the root's ``/etc/fstab`` names (parents before children)."""
    text = view.read_text("/etc/fstab")
    if text is None:
        return
    entries, errors = parse_fstab(text)
    view.warnings.extend(f"/etc/fstab {e}" for e in errors)
    others = []
    for fs in filesystems:
        if fs is view.root:
            continue
        try:
            others.append((fs, identify(fs)))
        except Exception as exc:  # noqa: BLE001  (a corrupt superblock: that filesystem is unnamed)
            view.warn(f"cannot identify a {type(fs).__name__}: {type(exc).__name__}")
    for entry in sorted(entries, key=lambda e: (wanted(e) or "").count("/")):
        mount = wanted(entry)
        if mount is None:
            continue
        found = [fs for fs, ident in others if match_device(entry.spec, ident)]
        if len(found) != 1:
            what = "not found in the image" if not found else f"matches {len(found)} filesystems"
            view.warn(f"/etc/fstab line {entry.line}: {entry.spec} for {mount} {what}; its files are not read")
            continue
        view.mounts[mount] = found[0]


def open_image(
    path: str | Path,
    *,
    max_file_bytes: int = 16 << 20,
    max_entries: int = 500_000,
    backing: BackingPolicy = BackingPolicy.SAME_DIR,
) -> ImageView:
    """Open a disk image (or an unpacked root directory) read-only.

    qcow2 backing chains are resolved by :func:`~carina.security.introspect.chains.open_chain`
    under ``backing``; everything else is detected by dissect.

    Raises:
        BackendUnavailable: dissect.target is not installed.
        ModelFormatError: The file does not exist or holds no filesystem dissect can read.
    """
    try:
        import dissect.target  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(
            "image introspection needs dissect.target (AGPL-3.0): pip install 'carina[security]'"
        ) from exc
    p = Path(path)
    if not p.exists():
        raise ModelFormatError("image not found", file=str(p))
    try:
        filesystems = _filesystems(p, backing)
        volumes = [type(fs).__name__.removesuffix("Filesystem").lower() for fs in filesystems]
    except Exception as exc:
        raise ModelFormatError(f"cannot open image: {type(exc).__name__}: {exc}", file=str(p)) from exc
    if not volumes:
        raise ModelFormatError("no filesystem found in image (unknown or corrupt format)", file=str(p))
    view = ImageView(
        source=str(p),
        root=_root_of(filesystems),
        max_file_bytes=max_file_bytes,
        max_entries=max_entries,
        volumes=volumes,
        host_root=os.path.realpath(p) if p.is_dir() else "",
    )
    if not p.is_dir():
        _assemble(view, filesystems)
    return view
