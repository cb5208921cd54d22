"""Truncated, corrupt and hostile images give a clear error or a report marked partial; never a crash."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from introspect_images import sha256

from carina.core.errors import ModelFormatError
from carina.security.introspect.image import open_image
from carina.security.introspect.inventory import collect_inventory
from carina.security.introspect.scan import ScanConfig, scan_image
from carina.testing.introspect import FakeDebian, build_image, write_tree


def test_missing_and_junk_images(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="not found"):
        open_image(tmp_path / "nope.img")
    junk = tmp_path / "junk.img"
    junk.write_bytes(random.Random(1).randbytes(1 << 20))
    with pytest.raises(ModelFormatError, match="no filesystem"):
        open_image(junk)
    report = scan_image(junk, ScanConfig())
    assert report.partial and "no filesystem" in report.error


def test_truncated_qcow2(debian_images: dict[str, Path], tmp_path: Path) -> None:
    src = debian_images["qcow2"]
    cut = tmp_path / "cut.qcow2"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 3])
    report = scan_image(cut, ScanConfig())
    assert report.partial  # either no filesystem at all, or unreadable files reported
    assert report.error or report.warnings


@pytest.fixture(scope="module")
def hostile_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_tree(tmp_path_factory.mktemp("hostile"), FakeDebian())
    (root / "etc/ssh/sshd_config").unlink()
    (root / "etc/ssh/sshd_config").symlink_to("/etc/ssh/loop")  # loop inside the image
    (root / "etc/ssh/loop").symlink_to("/etc/ssh/sshd_config")
    (root / "etc/passwd").unlink()
    (root / "etc/passwd").symlink_to("../../../../../../../etc/hostname")  # climbs out: stays inside the image
    (root / "var/lib/dpkg/status").write_text("Package: a\nVersion: 1\n\n\x00garbage line\n")
    (root / "var/log").mkdir(parents=True)
    with (root / "var/log/huge.log").open("wb") as fh:
        fh.truncate(64 << 20)  # sparse 64 MiB file
    (root / "etc/cron.d").mkdir()
    (root / "etc/cron.d/big").symlink_to("/var/log/huge.log")
    (root / "etc/hostname").write_text("inside-the-image\n")
    return root


def test_hostile_tree_is_partial_and_bounded(hostile_tree: Path, tmp_path: Path) -> None:
    image = build_image(hostile_tree, tmp_path / "hostile.ext4", "ext4", size_mb=120)
    before = sha256(image)
    report = scan_image(image, ScanConfig(max_file_bytes=1 << 20))
    assert report.error == "" and report.partial
    text = "\n".join(report.warnings)
    assert "/var/lib/dpkg/status" in text  # hostile database reported, not fatal
    assert "larger than 1048576 bytes" in text  # huge file cut
    assert report.inventory is not None and report.inventory.sshd == {}  # symlink loop: unreadable
    assert report.inventory.users == []  # passwd pointed at hostname *inside* the image
    assert sha256(image) == before


def test_walk_is_bounded(debian_images: dict[str, Path]) -> None:
    view = open_image(debian_images["ext4"], max_entries=10)
    inv = collect_inventory(view)
    assert any("walk stopped after 10 entries" in w for w in view.warnings)
    assert len(inv.file_modes) <= 10


@pytest.fixture(scope="module")
def small_ext4(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    work = tmp_path_factory.mktemp("small")
    return build_image(write_tree(work / "r", FakeDebian()), work / "s.ext4", "ext4", size_mb=8).read_bytes()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 256 * 1024 - 1), st.integers(0, 255)), min_size=1, max_size=64))
def test_corrupted_ext4_never_crashes(small_ext4: bytes, tmp_path_factory: pytest.TempPathFactory, flips) -> None:
    data = bytearray(small_ext4)
    for offset, value in flips:  # metadata lives in the first 256 KiB
        data[offset] = value
    path = tmp_path_factory.mktemp("fuzz") / "f.ext4"
    path.write_bytes(bytes(data))
    report = scan_image(path, ScanConfig(max_entries=5000))
    assert report.error or report.inventory is not None
    os.remove(path)
    shutil.rmtree(path.parent, ignore_errors=True)


def test_root_directory_symlinks_never_reach_the_host(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", FakeDebian())
    (root / "etc/passwd").unlink()
    (root / "etc/passwd").symlink_to("../../../../../../../../etc/hostname")
    (root / "etc/group").unlink()
    (root / "etc/group").symlink_to("/etc/hostname")
    view = open_image(root)
    assert view.read_text("/etc/passwd") is None and view.read_text("/etc/group") is None
    assert sum("outside the root directory" in w for w in view.warnings) == 2
    assert collect_inventory(view).os["ID"] == "debian"
