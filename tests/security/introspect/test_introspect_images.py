"""Every container/volume/filesystem variant gives the inventory dpkg-query gives, and no byte changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from introspect_images import FORMATS, dpkg_query, sha256

from carina.core.errors import ModelFormatError
from carina.security.introspect.chains import BackingPolicy
from carina.security.introspect.image import open_image
from carina.security.introspect.inventory import collect_inventory
from carina.security.introspect.scan import ScanConfig, scan_image


def _deb_set(inv) -> set[tuple[str, str, str]]:
    return {(p.name, p.version, p.arch) for p in inv.packages if p.kind == "deb"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_inventory_matches_dpkg_query_and_image_is_unchanged(debian_images: dict[str, Path], fmt: str) -> None:
    image = debian_images[fmt]
    tree = debian_images["root-top" if fmt == "qcow2-chain" else "root"]
    layers = [image, debian_images["base"]] if fmt == "qcow2-chain" else [image]
    before = [sha256(p) for p in layers]
    report = scan_image(image, ScanConfig())
    assert report.error == "" and not report.partial, report.warnings
    assert report.inventory is not None
    assert _deb_set(report.inventory) == dpkg_query(tree)
    assert [sha256(p) for p in layers] == before
    expected_fs = {"xfs": ["xfs"]}.get(fmt, ["ext"])
    assert report.volumes == expected_fs


def test_chain_reads_top_layer_over_base(debian_images: dict[str, Path]) -> None:
    top = scan_image(debian_images["qcow2-chain"], ScanConfig()).inventory
    base = scan_image(debian_images["base"], ScanConfig()).inventory
    assert top is not None and base is not None
    assert top.sshd["permitrootlogin"] == "yes"
    assert base.sshd["permitrootlogin"] == "prohibit-password"
    # the top layer is a delta: far smaller than the base's virtual disk
    assert debian_images["qcow2-chain"].stat().st_size < 8 << 20


def test_inventory_details(debian_images: dict[str, Path]) -> None:
    inv = collect_inventory(open_image(debian_images["gpt"]))
    assert inv.os["ID"] == "debian" and inv.os["VERSION_ID"] == "12" and inv.family == "debian"
    assert inv.kernels == ["6.1.0-18-amd64"]
    assert [u["name"] for u in inv.users] == ["root", "daemon", "sshd", "alice"]
    assert {"name": "sudo", "gid": 27, "members": ("alice",)} in inv.groups
    assert "/etc/sudoers.d/alice: alice ALL=(ALL) NOPASSWD: ALL" in inv.sudoers
    # Include comes first in sshd_config, so sshd_config.d's "no" beats the later "yes"
    assert inv.sshd["passwordauthentication"] == "no"
    assert inv.authorized_keys == {"root": 1}
    assert inv.services == ["ssh.service"]
    assert any("run-parts" in c for c in inv.cron) and "/etc/cron.daily/logrotate" in inv.cron
    assert inv.setuid == ["/usr/bin/passwd"]
    assert inv.world_writable == []
    lang = {(p.kind, p.name, p.version) for p in inv.packages if p.kind in ("pypi", "npm")}
    assert lang == {("pypi", "requests", "2.28.1"), ("npm", "@scope/tool", "1.2.3")}
    bash = next(p for p in inv.packages if p.name == "bash")
    assert (bash.source, bash.source_version) == ("bash", "5.2.15-2")


def test_backing_outside_directory_is_refused(debian_images: dict[str, Path], tmp_path: Path) -> None:
    child = tmp_path / "child.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(debian_images["base"]), "-F", "qcow2", str(child)],
        check=True,
    )
    with pytest.raises(ModelFormatError, match="outside the image's directory"):
        open_image(child)
    with pytest.raises(ModelFormatError, match="policy deny"):
        open_image(child, backing=BackingPolicy.DENY)
    inv = collect_inventory(open_image(child, backing=BackingPolicy.ANY))
    assert inv.os["ID"] == "debian"


def test_backing_loop_is_detected(tmp_path: Path) -> None:
    a, b = tmp_path / "a.qcow2", tmp_path / "b.qcow2"
    for p in (a, b):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(p), "1M"], check=True)
    subprocess.run(
        ["qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b", "b.qcow2", "-F", "qcow2", str(a)], check=True
    )
    subprocess.run(
        ["qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b", "a.qcow2", "-F", "qcow2", str(b)], check=True
    )
    with pytest.raises(ModelFormatError, match="loops"):
        open_image(a)


@pytest.mark.parametrize("fmt", ["ext4", "xfs", "lvm"])
def test_walk_agrees_with_lstat_of_the_tree(debian_images: dict[str, Path], fmt: str) -> None:
    import os

    root = debian_images["root"]
    want = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            size = st.st_size if p.is_file() and not p.is_symlink() else None
            want["/" + str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, size)
    if fmt == "xfs":  # mkfs.xfs protofiles cannot express the sticky bit
        mode, *rest = want["/tmp"]
        want["/tmp"] = (mode & ~0o1000, *rest)
    got = {}
    for e in open_image(debian_images[fmt]).walk("/"):
        if e.path == "/lost+found":
            continue
        regular = (e.mode & 0o170000) == 0o100000
        got[e.path] = (e.mode, e.uid, e.gid, e.size if regular else None)
    assert got == want
