"""carina's compliance verdicts next to OpenSCAP's on Debian's SCAP Security Guide content.

No SSG content for Debian 12 exists in Debian 12 (``ssg-debian`` 0.1.65 ships
debian10/11 data streams); the OVAL definitions of the rules carina shares with
it do not depend on the release, so the debian11 OVAL file is evaluated
directly (``oval eval``, no XCCDF platform check) with ``oscap-chroot`` on
the image mounted read-only (``mount -o ro,loop,noload``, when this process may
mount) or else on the tree the image was built from. OpenSCAP 1.3.7's
``dpkginfo`` probe does not work under ``oscap-chroot`` (it loads the host's
APT configuration and fails to initialise; upstream rewrote it without APT in
PR #2046), so SSG's sshd and package definitions, which depend on it, come out
``unknown`` and are not compared.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from carina.testing.introspect import FakeDebian, build_image, write_tree

__all__ = [
    "SHARED",
    "VARIANTS",
    "Variant",
    "build_variant",
    "compare",
    "have_oscap",
    "mounted",
    "oscap_results",
    "subset",
]

SSG_OVAL = Path("/usr/share/xml/scap/ssg/content/ssg-debian11-oval.xml")

# carina starter rule -> SSG definitions whose conjunction checks the same thing.
SHARED: dict[str, tuple[str, ...]] = {
    "shadow-permissions": ("file_permissions_etc_shadow", "file_owner_etc_shadow"),
    "passwd-permissions": ("file_permissions_etc_passwd", "file_owner_etc_passwd", "file_groupowner_etc_passwd"),
    "no-empty-passwords": ("no_empty_passwords_etc_shadow",),
    "uid0-only-root": ("accounts_no_uid_except_zero",),
    "no-world-writable-files": ("file_permissions_unauthorized_world_writable", "dir_perms_world_writable_sticky_bits"),
}


@dataclass(kw_only=True)
class Variant:
    """A tree mutated to pass or fail some of the shared rules."""

    name: str
    spec: FakeDebian = field(default_factory=FakeDebian)
    mutate: Callable[[Path], None] | None = None


def _uid0_and_file(root: Path) -> None:
    with (root / "etc/passwd").open("a") as fh:
        fh.write("toor:x:0:0:backdoor:/root:/bin/sh\n")


def _dir_and_passwd(root: Path) -> None:
    drop = root / "srv/drop"
    drop.mkdir(parents=True)
    drop.chmod(0o777)
    (root / "etc/passwd").chmod(0o664)
    if os.geteuid() == 0:
        os.chown(root / "etc/passwd", 1000, 0)


VARIANTS = [
    Variant(name="clean"),
    Variant(name="weak-shadow", spec=FakeDebian(shadow_mode=0o644, empty_password_user=True)),
    Variant(name="uid0-and-ww-file", spec=FakeDebian(world_writable=("srv/data/report.txt",)), mutate=_uid0_and_file),
    Variant(name="ww-dir-and-passwd", mutate=_dir_and_passwd),
    Variant(name="ww-file-in-tmp", spec=FakeDebian(world_writable=("tmp/scratch.txt",))),
]


def subset(content: Path, names: list[str], out: Path) -> Path:
    """Write the OVAL definitions ``names`` of ``content`` with everything they reference, and nothing else.

    Evaluating all 486 definitions makes unrelated probes fail under chroot
    (environmentvariable58: "Operation not permitted"), and then oscap writes no results.
    """
    tree = ET.parse(content)
    by_id = {
        el.attrib["id"]: el for el in tree.iter() if "id" in el.attrib and el.tag.rsplit("}", 1)[-1] != "generator"
    }
    todo = [f"oval:ssg-{n}:def:1" for n in names]
    keep: set[str] = set()
    while todo:
        ref = todo.pop()
        if ref in keep or ref not in by_id:
            continue
        keep.add(ref)
        for el in by_id[ref].iter():
            todo += [v for k, v in el.attrib.items() if k.endswith("_ref")]
            tag = el.tag.rsplit("}", 1)[-1]
            if tag in ("filter", "object_reference", "var_ref") and el.text:
                todo.append(el.text.strip())
    top = tree.getroot()
    for section in list(top):
        for el in list(section):
            if "id" in el.attrib and el.attrib["id"] not in keep:
                section.remove(el)
        if len(section) == 0:  # the schema forbids empty sections
            top.remove(section)
    tree.write(out, xml_declaration=True, encoding="utf-8")
    return out


def oscap_results(root: Path, content: Path = SSG_OVAL) -> dict[str, str]:
    """``oscap-chroot ROOT oval eval`` of the shared definitions: short name -> result (true/false/unknown)."""
    names = [d for defs in SHARED.values() for d in defs]
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "results.xml"
        proc = subprocess.run(
            [
                "oscap-chroot",
                str(root),
                "oval",
                "eval",
                "--results",
                str(res),
                str(subset(content, names, Path(tmp) / "s.xml")),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if not res.is_file():
            raise RuntimeError(f"oscap-chroot wrote no results (rc {proc.returncode}): {proc.stderr[-500:]}")
        tree = ET.parse(res)
    out = {}
    for el in tree.iter():
        if el.tag.endswith("}definition") and "result" in el.attrib and "definition_id" in el.attrib:
            out[el.attrib["definition_id"].removeprefix("oval:ssg-").removesuffix(":def:1")] = el.attrib["result"]
    return out


@contextlib.contextmanager
def mounted(image: Path) -> Iterator[Path | None]:
    """Mount an ext4 image read-only (journal not replayed); yields None where mounting is not permitted."""
    where = Path(tempfile.mkdtemp(prefix="carina-oscap-"))
    ok = subprocess.run(["mount", "-o", "ro,loop,noload", str(image), str(where)], capture_output=True).returncode == 0
    try:
        yield where if ok else None
    finally:
        if ok:
            subprocess.run(["umount", str(where)], check=True, capture_output=True)
        where.rmdir()


def build_variant(variant: Variant, work: Path) -> tuple[Path, Path]:
    """The variant's tree and an ext4 image of it."""
    root = write_tree(work / variant.name, variant.spec)
    if variant.mutate is not None:
        variant.mutate(root)
    return root, build_image(root, work / f"{variant.name}.ext4", "ext4", size_mb=32)


def compare(carina: dict[str, str], oscap: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Per shared rule: (carina's status, OpenSCAP's conjunction as pass/fail/other)."""
    out = {}
    for rule, defs in SHARED.items():
        results = [oscap.get(d, "missing") for d in defs]
        if all(r == "true" for r in results):
            theirs = "pass"
        elif "false" in results:
            theirs = "fail"
        else:
            theirs = "/".join(results)
        out[rule] = (carina.get(rule, "missing"), theirs)
    return out


def oscap_dpkg_eval(root: Path, oval: str) -> dict[str, str] | None:
    """``oscap oval eval`` of ``oval`` with the host's ``/var/lib/dpkg`` replaced by ``root``'s.

    The dpkginfo probe does not work under ``oscap-chroot`` in OpenSCAP 1.3.7, so this
    runs plain ``oscap`` in a private mount namespace (``unshare -m``) where ``root``'s
    dpkg directory is bind-mounted over the host's; nothing outside that namespace
    changes. Returns definition id -> result, or None where the namespace cannot be made
    (not root, or unshare refused).
    """
    with tempfile.TemporaryDirectory() as tmp:
        src, res = Path(tmp) / "defs.xml", Path(tmp) / "results.xml"
        src.write_text(oval)
        script = 'mount --bind "$1/var/lib/dpkg" /var/lib/dpkg && exec oscap oval eval --results "$2" "$3"'
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", script, "sh", str(root), str(res), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if not res.is_file():
            if "unshare" in proc.stderr or "mount" in proc.stderr:
                return None
            raise RuntimeError(f"oscap wrote no results (rc {proc.returncode}): {proc.stderr[-500:]}")
        tree = ET.parse(res)
    return {
        el.attrib["definition_id"]: el.attrib["result"]
        for el in tree.iter()
        if el.tag.endswith("}definition") and "result" in el.attrib and "definition_id" in el.attrib
    }


def have_oscap() -> bool:
    """Whether ``oscap-chroot`` and the SSG Debian content are installed."""
    return shutil.which("oscap-chroot") is not None and SSG_OVAL.is_file()
