"""carina's Debian matches exported as OVAL and evaluated by OpenSCAP (its own dpkg order, its own status reader)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from introspect_images import PLANTED

from carina.security.introspect.advisories import Advisory, import_db, load_db
from carina.security.introspect.image import open_image
from carina.security.introspect.inventory import collect_inventory
from carina.security.introspect.oval import advisory_oval, intervals
from carina.security.introspect.vulns import match
from carina.testing.introspect import FakeDebian, write_tree
from carina.testing.introspect_oscap import oscap_dpkg_eval

FIXTURES = Path(__file__).parent / "fixtures"


def test_intervals_follow_osv_events() -> None:
    adv = Advisory(
        id="X",
        package="p",
        ecosystem="Debian:12",
        ranges=((("introduced", "0"), ("fixed", "1.2-1")), (("introduced", "2.0-1"), ("last_affected", "2.3-1"))),
        versions=("0.9-1",),
    )
    assert intervals(adv) == [
        (("equals", "0.9-1"), None),
        (None, ("less than", "1.2-1")),
        (("greater than or equal", "2.0-1"), ("less than or equal", "2.3-1")),
    ]
    assert intervals(Advisory(id="Y", package="p", ecosystem="Debian:12", ranges=((("introduced", "0"),),))) == [
        (None, None)
    ]


@pytest.mark.skipif(shutil.which("oscap") is None or shutil.which("unshare") is None, reason="needs oscap, unshare")
def test_oscap_agrees_with_carina_on_planted_advisories(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", FakeDebian(packages=PLANTED))
    db = load_db(import_db([FIXTURES / "osv", FIXTURES / "tracker.json"], tmp_path / "adv.json"))
    inv = collect_inventory(open_image(root))
    xml, names = advisory_oval(db, inv.packages, os_version="12")
    (tmp_path / "defs.xml").write_text(xml)
    subprocess.run(["oscap", "oval", "validate", str(tmp_path / "defs.xml")], check=True, capture_output=True)
    results = oscap_dpkg_eval(root, xml)
    if results is None:
        pytest.skip("cannot make a private mount namespace here (needs root)")
    assert set(results) == set(names) and set(results.values()) <= {"true", "false"}
    theirs = {names[d] for d, r in results.items() if r == "true"}
    debs = {p.name for p in inv.packages if p.kind == "deb"}
    findings = match(inv.packages, db, os_id="debian", os_version="12")
    ours = {(f.id, f.package) for f in findings if not f.indeterminate and f.package in debs}
    assert ours == theirs
    labels = json.loads((FIXTURES / "labels.json").read_text())
    assert theirs == {(a, p) for a, p, _ in labels["vulnerable"] if p in debs}  # 18 hand-labelled pairs
