"""Planted vulnerable versions against a hand-labelled OSV + Debian tracker fixture: precision = recall = 1."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from carina.core.errors import ModelFormatError
from carina.security.introspect.advisories import Advisory, Severity, import_db, load_db, parse_osv
from carina.security.introspect.image import open_image
from carina.security.introspect.inventory import collect_inventory
from carina.security.introspect.packages import Package, parse_rpmdb
from carina.security.introspect.vulns import match

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> list[Advisory]:
    path = import_db([FIXTURES / "osv", FIXTURES / "tracker.json"], tmp_path_factory.mktemp("db") / "adv.json")
    return load_db(path)


def test_precision_and_recall_are_one(debian_images: dict[str, Path], db: list[Advisory]) -> None:
    labels = json.loads((FIXTURES / "labels.json").read_text())
    inv = collect_inventory(open_image(debian_images["qcow2"]))
    findings = match(inv.packages, db, os_id="debian", os_version="12")
    got = {(f.id, f.package) for f in findings if not f.indeterminate}
    want = {(a, p) for a, p, _ in labels["vulnerable"]}
    tp = len(got & want)
    precision, recall = tp / len(got), tp / len(want)
    assert len(want) >= 20
    assert (precision, recall) == (1.0, 1.0), (sorted(got - want), sorted(want - got))
    indeterminate = {(f.id, f.package) for f in findings if f.indeterminate}
    assert indeterminate == {(a, p) for a, p, _ in labels["indeterminate"]}
    assert not {f.id for f in findings} & set(labels["traps"])


def test_findings_carry_severity_and_fix(debian_images: dict[str, Path], db: list[Advisory]) -> None:
    inv = collect_inventory(open_image(debian_images["ext4"]))
    by = {(f.id, f.package): f for f in match(inv.packages, db, os_id="debian", os_version="12")}
    ssh = by[("DSA-0001-1", "openssh-server")]
    assert (ssh.installed, ssh.fixed, ssh.rank) == ("1:9.2p1-2+deb12u2", "1:9.2p1-2+deb12u3", Severity.HIGH)
    assert by[("DSA-0004-1", "zlib1g")].rank == Severity.CRITICAL
    assert by[("PYSEC-0001", "requests")].rank == Severity.MEDIUM  # MODERATE
    assert by[("CVE-2024-0004", "sudo")].fixed == ""


def test_withdrawn_and_malformed_osv() -> None:
    assert parse_osv({"id": "X", "withdrawn": "2024", "affected": []}) == []
    with pytest.raises(ModelFormatError, match="events"):
        parse_osv({"id": "X", "affected": [{"package": {"name": "a", "ecosystem": "Debian"}, "ranges": [{}]}]})
    with pytest.raises(ModelFormatError, match="'name'"):
        parse_osv({"id": "X", "affected": [{"package": {"ecosystem": "Debian"}}]}, where="f.json")


def test_import_rejects_bad_json_with_location(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "X",\n "affected": [}')
    with pytest.raises(ModelFormatError) as exc:
        import_db([bad], tmp_path / "db.json")
    assert exc.value.context["file"] == str(bad) and exc.value.context["line"] == 2
    assert not (tmp_path / "db.json").exists()


def _header(tags: dict[int, tuple[int, bytes]]) -> bytes:
    index, data = b"", b""
    for tag, (typ, payload) in tags.items():
        index += struct.pack(">IIiI", tag, typ, len(data), 1)
        data += payload
    return struct.pack(">II", len(tags), len(data)) + index + data


def make_rpmdb(path: Path, pkgs: list[tuple[str, int, str, str, str]]) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE Packages (hnum INTEGER PRIMARY KEY AUTOINCREMENT, blob BLOB NOT NULL)")
    for name, epoch, ver, rel, srpm in pkgs:
        tags = {
            1000: (6, name.encode() + b"\0"),
            1001: (6, ver.encode() + b"\0"),
            1002: (6, rel.encode() + b"\0"),
            1022: (6, b"x86_64\0"),
            1044: (6, srpm.encode() + b"\0"),
        }
        if epoch:
            tags[1003] = (4, struct.pack(">i", epoch))
        con.execute("INSERT INTO Packages (blob) VALUES (?)", (_header(tags),))
    con.commit()
    con.close()
    return path


def test_rpm_matching_uses_rpm_order_and_source_rpm(tmp_path: Path) -> None:
    db_path = make_rpmdb(
        tmp_path / "rpmdb.sqlite",
        [
            ("openssl-libs", 1, "3.0.7", "24.el9", "openssl-3.0.7-24.el9.src.rpm"),
            ("kernel-core", 0, "5.14.0", "362.8.1.el9_3", "kernel-5.14.0-362.8.1.el9_3.src.rpm"),
        ],
    )
    pkgs = parse_rpmdb(str(db_path))
    assert [(p.name, p.version, p.source) for p in pkgs] == [
        ("openssl-libs", "1:3.0.7-24.el9", "openssl"),
        ("kernel-core", "5.14.0-362.8.1.el9_3", "kernel"),
    ]
    advs = [
        Advisory(
            id="RLSA-1",
            package="openssl",
            ecosystem="Rocky Linux:9",
            ranges=((("introduced", "0"), ("fixed", "1:3.0.7-25.el9")),),
        ),
        Advisory(
            id="RLSA-2",
            package="kernel-core",
            ecosystem="Rocky Linux:9",
            ranges=((("introduced", "0"), ("fixed", "5.14.0-362.8.1.el9_3")),),
        ),
        Advisory(
            id="RLSA-3",
            package="kernel-core",
            ecosystem="Rocky Linux:9",
            ranges=((("introduced", "0"), ("fixed", "5.14.0-362.13.1.el9_3")),),
        ),
        Advisory(id="RLSA-4", package="kernel-core", ecosystem="Rocky Linux:8", ranges=((("introduced", "0"),),)),
    ]
    got = {(f.id, f.package) for f in match(pkgs, advs, os_id="rocky", os_version="9.3")}
    assert got == {("RLSA-1", "openssl-libs"), ("RLSA-3", "kernel-core")}


def test_source_version_is_used_for_debian() -> None:
    pkg = Package(name="libfoo1", version="1:5.0-1", kind="deb", source="foo", source_version="2.0-1")
    adv = Advisory(id="A", package="foo", ecosystem="Debian:12", ranges=((("introduced", "0"), ("fixed", "2.0-2")),))
    assert [f.id for f in match([pkg], [adv], os_id="debian", os_version="12")] == ["A"]
