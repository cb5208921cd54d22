"""Builders of real disk images for introspection tests and benchmarks, without root mounts.

A fake Debian root tree (a real dpkg ``status`` file, os-release, accounts,
sshd settings, services, cron, setuid and world-writable files, pip and npm
packages) is written with plain file operations, then packed with the real
tools: ``mke2fs -d`` (ext4), ``mkfs.xfs -p`` (XFS, protofile written here),
``sfdisk`` (GPT), ``qemu-img`` (qcow2, backing chains, VMDK streamOptimized)
and an LVM2 physical volume whose label and metadata are written here (no
device-mapper needed).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DebPkg", "FakeDebian", "build_image", "write_tree"]

MiB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DebPkg:
    """A package entry in the fake dpkg status file."""

    name: str
    version: str
    source: str = ""
    arch: str = "amd64"
    state: str = "installed"


@dataclass(kw_only=True)
class FakeDebian:
    """What the fake Debian tree holds."""

    packages: list[DebPkg] = field(default_factory=list)
    version_id: str = "12"
    codename: str = "bookworm"
    permit_root_login: str = "prohibit-password"
    password_authentication: str = "no"
    empty_password_user: bool = False
    world_writable: tuple[str, ...] = ()
    shadow_mode: int = 0o640
    filler_files: int = 0
    filler_bytes: int = 0


BASE_PACKAGES = [
    DebPkg(name="base-files", version="12.4+deb12u5"),
    DebPkg(name="libc6", version="2.36-9+deb12u4", source="glibc"),
    DebPkg(name="openssh-server", version="1:9.2p1-2+deb12u2", source="openssh"),
    DebPkg(name="openssh-client", version="1:9.2p1-2+deb12u2", source="openssh"),
    DebPkg(name="libssl3", version="3.0.11-1~deb12u2", source="openssl"),
    DebPkg(name="bash", version="5.2.15-2+b2", source="bash (5.2.15-2)"),
    DebPkg(name="sudo", version="1.9.13p3-1+deb12u1"),
    DebPkg(name="old-removed", version="0.1-1", state="config-files"),
]


def _status_file(pkgs: list[DebPkg]) -> str:
    paras = []
    for p in pkgs:
        want = "install" if p.state == "installed" else "deinstall"
        lines = [
            f"Package: {p.name}",
            f"Status: {want} ok {p.state}",
            "Priority: optional",
            "Section: misc",
            "Installed-Size: 100",
            "Maintainer: Debian Developers <debian-devel@lists.debian.org>",
            f"Architecture: {p.arch}",
        ]
        if p.source:
            lines.append(f"Source: {p.source}")
        lines += [f"Version: {p.version}", f"Description: {p.name} (test package)", " Planted by carina's tests."]
        paras.append("\n".join(lines))
    return "\n\n".join(paras) + "\n"


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def write_tree(root: Path, spec: FakeDebian) -> Path:
    """Write the fake Debian root tree described by ``spec`` under ``root``."""
    pkgs = spec.packages or BASE_PACKAGES
    _write(
        root,
        "etc/os-release",
        f'PRETTY_NAME="Debian GNU/Linux {spec.version_id} ({spec.codename})"\nNAME="Debian GNU/Linux"\n'
        f'VERSION_ID="{spec.version_id}"\nVERSION_CODENAME={spec.codename}\nID=debian\n',
    )
    _write(root, "etc/debian_version", f"{spec.version_id}.5\n")
    _write(root, "var/lib/dpkg/status", _status_file(pkgs))
    _write(
        root,
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
        "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\nalice:x:1000:1000:Alice:/home/alice:/bin/bash\n",
    )
    _write(root, "etc/group", "root:x:0:\nsudo:x:27:alice\nalice:x:1000:\n")
    alice_pw = "" if spec.empty_password_user else "$y$j9T$abc$def"
    _write(root, "etc/shadow", f"root:*:19700:0:99999:7:::\nalice:{alice_pw}:19700:0:99999:7:::\n", spec.shadow_mode)
    _write(root, "etc/sudoers", "Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d\n", 0o440)
    _write(root, "etc/sudoers.d/alice", "alice ALL=(ALL) NOPASSWD: ALL\n", 0o440)
    _write(
        root,
        "etc/ssh/sshd_config",
        "Include /etc/ssh/sshd_config.d/*.conf\n"
        f"PermitRootLogin {spec.permit_root_login}\nPasswordAuthentication yes\nX11Forwarding no\n"
        "Match User alice\n  PasswordAuthentication yes\n",
        0o600,
    )
    _write(root, "etc/ssh/sshd_config.d/10-auth.conf", f"PasswordAuthentication {spec.password_authentication}\n")
    _write(root, "root/.ssh/authorized_keys", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake root@admin\n", 0o600)
    _write(root, "lib/systemd/system/ssh.service", "[Unit]\nDescription=OpenBSD Secure Shell server\n")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    _write(root, "etc/crontab", "SHELL=/bin/sh\n17 * * * * root cd / && run-parts --report /etc/cron.hourly\n")
    _write(root, "etc/cron.daily/logrotate", "#!/bin/sh\n", 0o755)
    _write(root, "usr/bin/passwd", "\x7fELF fake\n", 0o755)
    (root / "usr/bin/passwd").chmod(0o4755)
    _write(root, "boot/vmlinuz-6.1.0-18-amd64", "kernel")
    (root / "lib/modules/6.1.0-18-amd64").mkdir(parents=True, exist_ok=True)
    meta = "Metadata-Version: 2.1\nName: requests\nVersion: 2.28.1\n\nLong description: 1\n"
    _write(root, "usr/lib/python3/dist-packages/requests-2.28.1.dist-info/METADATA", meta)
    _write(root, "usr/lib/node_modules/@scope/tool/package.json", '{"name": "@scope/tool", "version": "1.2.3"}')
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for rel in spec.world_writable:
        _write(root, rel, "x\n", 0o666)
        (root / rel).chmod(0o666)
    _filler(root, spec.filler_files, spec.filler_bytes)
    return root


def _filler(root: Path, count: int, nbytes: int) -> None:
    """``count`` files of random bytes, ``nbytes`` in all, 256 per directory (like /usr/share)."""
    if count <= 0:
        return
    per = max(1, nbytes // count)
    pool = os.urandom(4 * MiB)
    for i in range(count):
        path = root / "usr/share/filler" / f"d{i // 256}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        start = (i * 7919) % (len(pool) - min(per, len(pool)) + 1)
        with path.open("wb") as fh:
            left = per
            while left > 0:
                n = min(left, len(pool) - start)
                fh.write(pool[start : start + n])
                left, start = left - n, 0


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def _tree_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*"))


def _ext4(root: Path, out: Path, size_mb: int) -> Path:
    _run("mke2fs", "-q", "-F", "-t", "ext4", "-L", "rootfs", "-d", str(root), str(out), f"{size_mb}M")
    return out


def _xfs_proto(root: Path) -> str:
    lines = ["/dummy", "0 0", "d--755 0 0"]

    def walk(d: Path, depth: int) -> None:
        for child in sorted(d.iterdir()):
            st = child.lstat()
            perm = f"{stat.S_IMODE(st.st_mode) & 0o777:03o}"
            suid = "u" if st.st_mode & stat.S_ISUID else "-"
            ind = " " * depth
            if child.is_symlink():
                lines.append(f"{ind}{child.name} l--{perm} 0 0 {os.readlink(child)}")
            elif child.is_dir():
                lines.append(f"{ind}{child.name} d--{perm} 0 0")
                walk(child, depth + 1)
                lines.append(f"{ind}$")
            else:
                lines.append(f"{ind}{child.name} -{suid}-{perm} 0 0 {child}")

    walk(root, 1)
    lines.append("$")
    return "\n".join(lines) + "\n"


def _xfs(root: Path, out: Path, size_mb: int) -> Path:
    proto = out.with_suffix(".proto")
    proto.write_text(_xfs_proto(root))
    with out.open("wb") as fh:
        fh.truncate(max(size_mb, 300) * MiB)
    _run("mkfs.xfs", "-q", "-f", "-p", str(proto), str(out))
    proto.unlink()
    return out


def _gpt(fs: Path, out: Path) -> Path:
    size = fs.stat().st_size
    with out.open("wb") as fh:
        fh.truncate(size + 2 * MiB)
    layout = f"label: gpt\nstart=2048, size={size // 512}, type=0FC63DAF-8483-4772-8E47-3D69D8477DE4\n"
    subprocess.run(["sfdisk", "-q", str(out)], input=layout.encode(), check=True, capture_output=True)
    with fs.open("rb") as src, out.open("r+b") as dst:
        dst.seek(MiB)
        shutil.copyfileobj(src, dst, 4 * MiB)
    return out


def _lvm_crc(data: bytes) -> int:
    # LVM2's calc_crc: reflected CRC-32 table, seed 0xf597a6cf, no final inversion.
    return ~zlib.crc32(data, ~0xF597A6CF & 0xFFFFFFFF) & 0xFFFFFFFF


def lvm_pv(lvs: list[tuple[str, Path]], out: Path, device: str = "/dev/sda") -> Path:
    """One LVM2 physical volume, volume group ``vg0``, one linear LV per ``(name, filesystem image)``."""
    extent, pe_start, mda = 4 * MiB, 1 * MiB, 4096
    sizes = [-(-fs.stat().st_size // extent) for _, fs in lvs]
    dev_size = pe_start + sum(sizes) * extent
    pv_id = uuid.uuid4().hex[:32]
    blocks, start = [], 0
    for (name, _), count in zip(lvs, sizes, strict=True):
        blocks.append(
            f'{name} {{\nid = "{uuid.uuid4().hex[:32]}"\nstatus = ["READ", "WRITE", "VISIBLE"]\nflags = []\n'
            f"segment_count = 1\nsegment1 {{\nstart_extent = 0\nextent_count = {count}\n"
            f'type = "striped"\nstripe_count = 1\nstripes = [\n"pv0", {start}\n]\n}}\n}}\n'
        )
        start += count
    text = (
        f'vg0 {{\nid = "{uuid.uuid4().hex[:32]}"\nseqno = 1\nformat = "lvm2"\n'
        f'status = ["RESIZEABLE", "READ", "WRITE"]\nflags = []\nextent_size = {extent // 512}\n'
        "max_lv = 0\nmax_pv = 0\nmetadata_copies = 0\n"
        f'physical_volumes {{\npv0 {{\nid = "{pv_id}"\ndevice = "{device}"\nstatus = ["ALLOCATABLE"]\n'
        f"flags = []\ndev_size = {dev_size // 512}\npe_start = {pe_start // 512}\npe_count = {sum(sizes)}\n}}\n}}\n"
        f"logical_volumes {{\n{''.join(blocks)}}}\n}}\n"
        'contents = "Text Format Volume Group"\nversion = 1\n'
    )
    meta = text.encode() + b"\0"
    label = bytearray(512)
    pv_header = pv_id.encode() + dev_size.to_bytes(8, "little")
    pv_header += pe_start.to_bytes(8, "little") + bytes(8) + bytes(16)
    pv_header += mda.to_bytes(8, "little") + (pe_start - mda).to_bytes(8, "little") + bytes(16)
    label[0:8], label[8:16], label[20:24], label[24:32] = (
        b"LABELONE",
        (1).to_bytes(8, "little"),
        (32).to_bytes(4, "little"),
        b"LVM2 001",
    )
    label[32 : 32 + len(pv_header)] = pv_header
    label[16:20] = _lvm_crc(bytes(label[20:])).to_bytes(4, "little")
    hdr = bytearray(512)
    hdr[4:20] = b" LVM2 x[5A%r0N*>"
    hdr[20:24] = (1).to_bytes(4, "little")
    hdr[24:32], hdr[32:40] = mda.to_bytes(8, "little"), (pe_start - mda).to_bytes(8, "little")
    hdr[40:48], hdr[48:56] = (512).to_bytes(8, "little"), len(meta).to_bytes(8, "little")
    hdr[56:60] = _lvm_crc(meta).to_bytes(4, "little")
    hdr[0:4] = _lvm_crc(bytes(hdr[4:])).to_bytes(4, "little")
    with out.open("wb") as fh:
        fh.truncate(dev_size)
        for offset, data in ((512, label), (mda, hdr), (mda + 512, meta)):
            fh.seek(offset)
            fh.write(data)
        at = pe_start
        for (_, fs), count in zip(lvs, sizes, strict=True):
            fh.seek(at)
            with fs.open("rb") as src:
                shutil.copyfileobj(src, fh, 4 * MiB)
            at += count * extent
    return out


def _lvm(fs: Path, out: Path) -> Path:
    """A one-PV volume group ``vg0`` with one linear LV ``root`` holding ``fs``."""
    return lvm_pv([("root", fs)], out)


def build_image(
    root: Path, out: Path, fmt: str, *, size_mb: int | None = None, base: Path | None = None, compress: bool = True
) -> Path:
    """Pack ``root`` into an image at ``out``.

    Args:
        root: The root tree.
        out: Image path to create.
        fmt: ``ext4``, ``xfs``, ``gpt`` (GPT + ext4), ``lvm`` (LVM2 PV + ext4),
            ``qcow2`` (compressed qcow2 of a GPT disk), ``vmdk`` (streamOptimized),
            ``qcow2-chain`` (qcow2 whose clusters shared with ``base``, a qcow2 of
            another tree, are left to that backing file).
        size_mb: Filesystem size (default: room for the tree).
        base: Backing file for ``qcow2-chain``.
        compress: Compress qcow2 clusters (slow for large incompressible trees).
    """
    size = size_mb or max(32, int(_tree_bytes(root) * 1.3 / MiB) + 24)
    work = out.with_name(out.name + ".work")
    if fmt == "ext4":
        return _ext4(root, out, size)
    if fmt == "xfs":
        return _xfs(root, out, size)
    fs = _ext4(root, work.with_suffix(".ext4"), size)
    try:
        if fmt == "gpt":
            return _gpt(fs, out)
        if fmt == "lvm":
            return _lvm(fs, out)
        disk = _gpt(fs, work.with_suffix(".gpt"))
        if fmt == "qcow2":
            _run("qemu-img", "convert", *(["-c"] if compress else []), "-f", "raw", "-O", "qcow2", str(disk), str(out))
        elif fmt == "vmdk":
            _run(
                "qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", str(disk), str(out)
            )
        elif fmt == "qcow2-chain" and base is not None:
            _run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(disk), str(out))
            _run("qemu-img", "rebase", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(out))
        else:
            raise ValueError(f"unknown image format {fmt!r} (qcow2-chain needs base=)")
        disk.unlink()
        return out
    finally:
        fs.unlink(missing_ok=True)
