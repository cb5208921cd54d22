"""carina's starter rules against OpenSCAP (oscap-chroot) on Debian's SSG OVAL content, on the same images."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from introspect_images import sha256

from carina.security.introspect.scan import ScanConfig, scan_image
from carina.testing.introspect_oscap import VARIANTS, build_variant, compare, have_oscap, mounted, oscap_results

pytestmark = pytest.mark.skipif(not have_oscap(), reason="needs oscap-chroot (openscap-utils) and ssg-debian")

P, F = "pass", "fail"
# Rules: shadow-permissions, passwd-permissions, no-empty-passwords, uid0-only-root, no-world-writable-files.
EXPECTED = {
    "clean": [(P, P), (P, P), (P, P), (P, P), (P, P)],
    "weak-shadow": [(F, F), (P, P), (F, F), (P, P), (P, P)],
    "uid0-and-ww-file": [(P, P), (P, P), (P, P), (F, F), (F, F)],
    "ww-dir-and-passwd": [(P, P), (F, F), (P, P), (P, P), (F, F)],
    # carina exempts /tmp, /var/tmp and /dev/shm from the world-writable rule; SSG does not.
    "ww-file-in-tmp": [(P, P), (P, P), (P, P), (P, P), (P, F)],
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_carina_agrees_with_oscap_chroot(tmp_path: Path, variant) -> None:
    root, image = build_variant(variant, tmp_path)
    before = sha256(image)
    report = scan_image(image, ScanConfig())
    assert report.error == "" and not report.partial, report.warnings
    ours = {r.id: r.status.value for r in report.compliance}
    with mounted(image) as where:  # read-only loop mount where permitted, else the tree the image holds
        theirs = oscap_results(where or root)
    table = compare(ours, theirs)
    assert sha256(image) == before
    if os.geteuid() == 0:  # owners in the tree are the builder's uid; the table assumes root-owned files
        assert list(table.values()) == EXPECTED[variant.name]
    disagree = {rule for rule, (a, b) in table.items() if a != b}
    assert disagree == ({"no-world-writable-files"} if variant.name == "ww-file-in-tmp" else set())
