"""Small, honest probes of this machine used by ``carina doctor``.

Each probe tries the real thing (an O_DIRECT write, an ``io_uring_setup``
system call, a pinned allocation) and reports what happened, never a guess.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PathProbe", "ToolProbe", "filesystem_of", "probe_io_uring", "probe_path", "probe_tool"]

_SYS_IO_URING_SETUP = {"x86_64": 425, "aarch64": 425}


@dataclass
class PathProbe:
    """What a storage path supports."""

    path: str
    exists: bool
    filesystem: str
    device: str
    free_bytes: int | None
    o_direct: bool
    o_direct_reason: str


@dataclass
class ToolProbe:
    """A system tool: where it is and its version line, or how to get it."""

    name: str
    path: str | None
    version: str
    install: str


def filesystem_of(path: Path) -> tuple[str, str]:
    """``(fstype, device)`` of the mount holding ``path``, from /proc/self/mounts."""
    best, fstype, device = "", "unknown", "unknown"
    target = str(path.resolve())
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return fstype, device
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, device, fstype = mnt, parts[0], parts[2]
    return fstype, device


def probe_o_direct(directory: Path) -> tuple[bool, str]:
    """Write and read back 4 KiB with O_DIRECT in ``directory``."""
    if not hasattr(os, "O_DIRECT"):
        return False, "this OS has no O_DIRECT"
    try:
        handle, name = tempfile.mkstemp(dir=directory, prefix=".carina-odirect-")
    except OSError as exc:
        return False, f"cannot create a file: {exc.strerror or exc}"
    os.close(handle)
    try:
        fd = os.open(name, os.O_RDWR | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 4096)  # page-aligned
            buf.write(b"c" * 4096)
            if os.pwritev(fd, [buf], 0) != 4096:
                return False, "short O_DIRECT write"
            back = mmap.mmap(-1, 4096)
            if os.preadv(fd, [back], 0) != 4096 or back[:] != buf[:]:
                return False, "O_DIRECT read-back mismatch"
        finally:
            os.close(fd)
        return True, "4 KiB aligned write and read-back succeeded"
    except OSError as exc:
        return False, f"{exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


def probe_path(path: Path) -> PathProbe:
    """Probe a storage path (its filesystem, free space, O_DIRECT)."""
    exists = path.exists()
    where = path if path.is_dir() else path.parent
    fstype, device = filesystem_of(where) if where.exists() else ("unknown", "unknown")
    free = shutil.disk_usage(where).free if where.exists() else None
    if where.exists():
        ok, why = probe_o_direct(where)
    else:
        ok, why = False, "path does not exist"
    return PathProbe(str(path), exists, fstype, device, free, ok, why)


def probe_io_uring() -> tuple[bool, str]:
    """Call ``io_uring_setup(1, params)`` and report whether the kernel allows it."""
    if platform.system() != "Linux":
        return False, "io_uring is Linux-only"
    nr = _SYS_IO_URING_SETUP.get(platform.machine())
    if nr is None:
        return False, f"unknown syscall number on {platform.machine()}"
    try:
        disabled = Path("/proc/sys/kernel/io_uring_disabled").read_text().strip()
    except OSError:
        disabled = "0"
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    fd = libc.syscall(nr, 1, params)
    if fd < 0:
        err = ctypes.get_errno()
        return False, f"io_uring_setup failed: {os.strerror(err)} (io_uring_disabled={disabled})"
    os.close(fd)
    return True, f"io_uring_setup succeeded (kernel {platform.release()})"


_APT_PACKAGE = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "qemu-storage-daemon": "qemu-system-common",
    "tgtd": "tgt",
    "nbdkit": "nbdkit",
    "fio": "fio",
    "mmdebstrap": "mmdebstrap",
    "nbdcopy": "libnbd-bin",
    "nvidia-smi": "nvidia-driver (from NVIDIA)",
}
_VERSION_ARGS = {"tgtd": None, "nvidia-smi": ["--version"]}


def probe_tool(name: str) -> ToolProbe:
    """Find ``name`` on PATH (and /usr/sbin) and read its version line."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    pkg = _APT_PACKAGE.get(name, name)
    install = f"apt-get install -y {pkg}" if "(" not in pkg else f"install {pkg}"
    if path is None:
        return ToolProbe(name, None, "", install)
    args = _VERSION_ARGS.get(name, ["--version"])
    version = "present"
    if args is not None:
        try:
            out = subprocess.run([path, *args], capture_output=True, text=True, timeout=10)
            text = (out.stdout or out.stderr).strip().splitlines()
            version = text[0] if text else "present"
        except (OSError, subprocess.TimeoutExpired):
            version = "present (version unreadable)"
    return ToolProbe(name, path, version, install)
