"""A tiny bootable guest for provisioning tests: kernel + busybox initramfs + ext4 root.

Everything is built at run time from what the machine has installed (Debian packages
``linux-image-cloud-amd64`` and ``busybox-static``); nothing is downloaded::

    guest = find_guest_kernel()                       # raises BackendUnavailable with the fix
    golden = build_golden_image(tmp / "golden.raw", label="golden-1")
    initrd = build_initramfs(tmp / "initrd.gz", guest)

The initramfs loads the virtio block driver, mounts ``/dev/vda`` read-write, prints
``CARINA-READY image=<label> boots=<n>`` on the serial console (``n`` counts earlier
boots recorded on that disk), appends one line to ``/var/carina-boots`` and powers
off. Reading the marker therefore proves the guest booted *and* read its network disk;
the boot count proves writes persist in the node's clone.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from carina.core.errors import BackendUnavailable, ProvisioningError

__all__ = [
    "READY_MARKER",
    "GuestKernel",
    "build_golden_image",
    "build_initramfs",
    "find_guest_kernel",
    "newc_archive",
    "parse_ready_line",
]

READY_MARKER = "CARINA-READY"
_BLOCK_MODULES = ("virtio_blk",)
_BUSYBOX = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /lib/modules/$m.ko; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
if mount -t ext4 /dev/vda /mnt; then
  n=$(cat /mnt/var/carina-boots 2>/dev/null | wc -l)
  echo "CARINA-READY image=$(cat /mnt/etc/carina-image) boots=$n"
  echo boot >> /mnt/var/carina-boots
  umount /mnt
else
  echo "CARINA-FAILED no root disk"
fi
sync
poweroff -f
"""


@dataclass(frozen=True)
class GuestKernel:
    """A kernel image and the module tree that matches it."""

    vmlinuz: Path
    modules: Path
    busybox: Path


def find_guest_kernel(boot: Path = Path("/boot"), modules: Path = Path("/lib/modules")) -> GuestKernel:
    """Find an installed x86-64 kernel with virtio modules, and a static busybox.

    Raises:
        BackendUnavailable: No kernel or busybox; the message names the packages.
    """
    fix = "apt-get install linux-image-cloud-amd64 busybox-static"
    busybox = next((p for p in _BUSYBOX if p.is_file() and _is_static(p)), None)
    if busybox is None:
        raise BackendUnavailable(f"no static busybox: {fix}")
    for vmlinuz in sorted(boot.glob("vmlinuz-*"), reverse=True):
        version = vmlinuz.name.removeprefix("vmlinuz-")
        tree = modules / version
        if (tree / "modules.dep").is_file() and os.access(vmlinuz, os.R_OK):
            return GuestKernel(vmlinuz=vmlinuz, modules=tree, busybox=busybox)
    raise BackendUnavailable(f"no readable kernel with modules under {boot}: {fix}")


def _is_static(path: Path) -> bool:
    # A dynamic busybox cannot run in an initramfs without libc: its ELF names an interpreter.
    with path.open("rb") as fh:
        head = fh.read(4096)
    return head.startswith(b"\x7fELF") and b"ld-linux" not in head


def module_chain(tree: Path, names: tuple[str, ...] = _BLOCK_MODULES) -> list[Path]:
    """The ``.ko`` files needed for ``names``, dependencies first (from modules.dep)."""
    deps: dict[str, list[str]] = {}
    for line in (tree / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[Path(target).name.removesuffix(".ko")] = [p for p in rest.split() if p]
    paths = {Path(t).name.removesuffix(".ko"): t for t in _dep_targets(tree)}
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name not in deps:
            raise BackendUnavailable(f"kernel module {name} not found in {tree}")
        for dep in deps[name]:
            visit(Path(dep).name.removesuffix(".ko"))
        order.append(name)

    for name in names:
        visit(name)
    extra = ["virtio_pci"]  # the PCI transport is not a symbol dependency of virtio_blk
    for name in extra:
        visit(name)
    return [tree / paths[n] for n in order]


def _dep_targets(tree: Path) -> list[str]:
    return [line.partition(":")[0] for line in (tree / "modules.dep").read_text().splitlines() if line]


def newc_archive(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive in the ``newc`` format the kernel unpacks as an initramfs.

    Args:
        entries: ``(name, mode, data)``; directories have ``stat.S_IFDIR`` modes and no data.
    """
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        raw = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0]
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + raw)
        out.write(b"\0" * (-out.tell() % 4))
        out.write(data)
        out.write(b"\0" * (-out.tell() % 4))
    return out.getvalue()


def build_initramfs(dest: Path, kernel: GuestKernel) -> Path:
    """Write the gzip'd busybox initramfs described in the module docstring."""
    chain = module_chain(kernel.modules)
    d, f = stat.S_IFDIR | 0o755, stat.S_IFREG
    entries: list[tuple[str, int, bytes]] = [
        (name, d, b"") for name in ("bin", "dev", "proc", "sys", "mnt", "lib", "lib/modules")
    ]
    entries.append(("bin/busybox", f | 0o755, kernel.busybox.read_bytes()))
    entries.append(("init", f | 0o755, _INIT.encode()))
    entries.append(("modules.order", f | 0o644, "\n".join(p.stem for p in chain).encode() + b"\n"))
    entries += [(f"lib/modules/{p.name}", f | 0o644, p.read_bytes()) for p in chain]
    dest.write_bytes(gzip.compress(newc_archive(entries), compresslevel=1))
    return dest


def build_golden_image(dest: Path, *, label: str, size_mib: int = 64, fill_mib: int = 0) -> Path:
    """Make a raw ext4 image whose ``/etc/carina-image`` holds ``label``.

    Args:
        dest: The raw image to write.
        label: What the guest prints after ``image=``.
        size_mib: Virtual size.
        fill_mib: Incompressible filler written into ``/var/payload`` (for benchmarks).
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", label):
        raise ProvisioningError("label must be 1-64 of [A-Za-z0-9._-]", label=label)
    root = dest.with_name(dest.name + ".root")
    shutil.rmtree(root, ignore_errors=True)
    (root / "etc").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "etc" / "carina-image").write_text(label + "\n")
    if fill_mib:
        with (root / "var" / "payload").open("wb") as fh:
            for _ in range(fill_mib):
                fh.write(os.urandom(1 << 20))
    try:
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-d", str(root), str(dest), f"{size_mib}M"],
            check=True,
            capture_output=True,
            text=True,
        )
    except FileNotFoundError as exc:
        raise BackendUnavailable("mkfs.ext4 missing: apt-get install e2fsprogs") from exc
    except subprocess.CalledProcessError as exc:
        raise ProvisioningError(f"mkfs.ext4 failed: {exc.stderr.strip()}", path=str(dest)) from exc
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return dest


def parse_ready_line(console: str) -> dict[str, str] | None:
    """The ``key=value`` fields of the first READY line on a serial console, or None."""
    for line in console.splitlines():
        if line.startswith(READY_MARKER):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return None
