"""A multi-partition disk for introspection tests: root, ``/usr`` and an LVM ``/var`` and ``/home``.

The root tree written by :func:`carina.testing.introspect.write_tree` is
merged-/usr (``/bin``, ``/sbin``, ``/lib`` become symlinks into ``/usr``) and
split the way an installer would: ``/`` on GPT partition 1 (ext4, label
``rootfs``), ``/usr`` on partition 2 (ext4, found by UUID), and an LVM2
physical volume on partition 3 with ``vg0/var`` (XFS, named through
``/dev/mapper``) and ``vg0/home`` (ext4, named ``/dev/vg0/home``). The
root's ``/etc/fstab`` ties them together. Built with the real ``mke2fs -d``,
``mkfs.xfs -p``, ``sfdisk`` and ``qemu-img``; nothing is mounted.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

from carina.testing.introspect import MiB, _ext4, _run, _tree_bytes, _xfs, lvm_pv

__all__ = ["USR_UUID", "build_split_image", "fstab_text", "usrmerge"]

USR_UUID = "3f1c2b9e-5d6a-4e7f-8a9b-0c1d2e3f4a5b"


def fstab_text() -> str:
    """The fstab written into the split image's root (with entries a scanner must skip)."""
    return (
        "# /etc/fstab: static file system information.\n"
        "# <file system> <mount point>   <type>  <options>       <dump>  <pass>\n"
        "LABEL=rootfs    /               ext4    errors=remount-ro 0     1\n"
        f"UUID={USR_UUID.upper()} /usr ext4 defaults,ro 0 2\n"
        "/dev/mapper/vg0-var /var xfs defaults 0 2\n"
        "/dev/vg0/home\t/home\text4\tdefaults,nodev\t0\t2\n"
        "tmpfs /tmp tmpfs defaults 0 0\n"
        "/swapfile none swap sw 0 0\n"
        "/dev/sr0 /media/cdrom0 udf,iso9660 user,noauto 0 0\n"
    )


def usrmerge(root: Path) -> None:
    """Move ``/bin``, ``/sbin`` and ``/lib`` under ``/usr`` and leave relative symlinks behind."""
    for name in ("bin", "sbin", "lib"):
        src, dst = root / name, root / "usr" / name
        dst.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(src)
        src.symlink_to(f"usr/{name}")


def _split(root: Path, work: Path) -> dict[str, Path]:
    """Copy ``root`` into one staging tree per filesystem; mount points stay as empty directories."""
    parts = {"/": work / "p-root", "/usr": work / "p-usr", "/var": work / "p-var", "/home": work / "p-home"}
    shutil.copytree(root, parts["/"], symlinks=True)
    for mount, stage in parts.items():
        if mount == "/":
            continue
        inside = parts["/"] / mount.lstrip("/")
        if inside.exists():
            shutil.copytree(inside, stage, symlinks=True)
            shutil.rmtree(inside)
        else:
            stage.mkdir()
        inside.mkdir()
    return parts


def _gpt_multi(parts: list[tuple[str, Path]], out: Path) -> Path:
    """A GPT disk holding each ``(partition name, image)`` in order, 1 MiB aligned."""
    lines, offsets, at = ["label: gpt"], [], MiB
    for name, img in parts:
        sectors = -(-img.stat().st_size // MiB) * (MiB // 512)
        lines.append(f'start={at // 512}, size={sectors}, type=0FC63DAF-8483-4772-8E47-3D69D8477DE4, name="{name}"')
        offsets.append(at)
        at += sectors * 512
    with out.open("wb") as fh:
        fh.truncate(at + MiB)
    subprocess.run(["sfdisk", "-q", str(out)], input="\n".join(lines).encode() + b"\n", check=True, capture_output=True)
    with out.open("r+b") as dst:
        for (_, img), offset in zip(parts, offsets, strict=True):
            dst.seek(offset)
            with img.open("rb") as src:
                shutil.copyfileobj(src, dst, 4 * MiB)
    return out


def _size(tree: Path) -> int:
    return max(16, int(_tree_bytes(tree) * 1.3 / MiB) + 16)


def _mkext4(tree: Path, out: Path, label: str, fs_uuid: str) -> Path:
    _run("mke2fs", "-q", "-F", "-t", "ext4", "-L", label, "-U", fs_uuid, "-d", str(tree), str(out), f"{_size(tree)}M")
    return out


def build_split_image(root: Path, out: Path, *, fmt: str = "qcow2", fstab: str | None = None) -> Path:
    """Split ``root`` over four filesystems (see the module docstring) and pack them as one disk.

    Writes ``/etc/fstab`` (:func:`fstab_text`) into the root partition and
    merges ``/usr`` first. ``root`` itself is changed the same way (fstab
    written, merged-/usr), so it stays the oracle for what the image holds.

    Args:
        root: The tree to split (changed in place: fstab and merged-/usr).
        out: The image to create.
        fmt: ``raw`` or ``qcow2``.
        fstab: The fstab to write instead of :func:`fstab_text` (the partitions are the same).
    """
    (root / "etc/fstab").write_text(fstab_text() if fstab is None else fstab)
    usrmerge(root)
    work = out.with_name(out.name + ".work")
    work.mkdir()
    try:
        parts = _split(root, work)
        fs_root = _ext4(parts["/"], work / "root.ext4", _size(parts["/"]))
        usr = _mkext4(parts["/usr"], work / "usr.ext4", "usr", USR_UUID)
        var = _xfs(parts["/var"], work / "var.xfs", 300)
        home = _mkext4(parts["/home"], work / "home.ext4", "home", str(uuid.uuid4()))
        pv = lvm_pv([("var", var), ("home", home)], work / "pv.lvm", device="/dev/sda3")
        raw = _gpt_multi([("root", fs_root), ("usr", usr), ("lvm", pv)], out if fmt == "raw" else work / "disk.raw")
        if fmt == "qcow2":
            _run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out))
        elif fmt != "raw":
            raise ValueError(f"unknown split image format {fmt!r} (raw or qcow2)")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
