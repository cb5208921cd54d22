"""Real images built once per test session from a fake Debian tree (no root mounts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from introspect_images import FORMATS, PLANTED

from carina.testing.introspect import FakeDebian, build_image, write_tree


@pytest.fixture(scope="session")
def debian_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One image per format; the chain's top layer holds a different tree (PermitRootLogin yes)."""
    work = tmp_path_factory.mktemp("images")
    root = write_tree(work / "root", FakeDebian(packages=PLANTED))
    top = write_tree(work / "root-top", FakeDebian(packages=PLANTED, permit_root_login="yes"))
    images = {"root": root, "root-top": top}
    base = build_image(root, work / "base.qcow2", "qcow2", size_mb=48)
    for fmt in FORMATS:
        tree = top if fmt == "qcow2-chain" else root
        images[fmt] = build_image(tree, work / f"disk.{fmt}", fmt, size_mb=48, base=base)
    images["base"] = base
    return images
