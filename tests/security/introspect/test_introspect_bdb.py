"""The Berkeley DB hash reader against libdb (db5.3_load writes, carina reads) and rpm's own bdb_ro backend."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from introspect_images import make_hash_db, rpm_header, sha256

from carina.core.errors import ModelFormatError
from carina.security.introspect.bdb import read_hash_db
from carina.security.introspect.packages import parse_rpm_bdb
from carina.security.introspect.scan import ScanConfig, scan_image
from carina.testing.introspect import build_image

pytestmark = pytest.mark.skipif(shutil.which("db5.3_load") is None, reason="needs db5.3_load (db5.3-util)")

PKGS = [  # name, epoch, version, release, pad (bytes of description: off-page when large)
    ("bash", 0, "4.2.46", "35.el7_9", 30),
    ("openssl-libs", 1, "1.0.2k", "26.el7_9", 9000),
    ("kernel", 0, "3.10.0", "1160.el7", 70000),
    ("glibc", 0, "2.17", "326.el7_9", 1500),
    ("zlib", 0, "1.2.7", "21.el7_9", 0),
]


def _rpm_db(path: Path, pagesize: int = 4096) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    records = {struct.pack("<I", 0): struct.pack("<I", len(PKGS))}  # rpm's bookkeeping record
    for i, (name, epoch, ver, rel, pad) in enumerate(PKGS, 1):
        records[struct.pack("<I", i)] = rpm_header(name, epoch, ver, rel, pad=pad)
    return make_hash_db(path / "Packages", records, pagesize=pagesize)


@pytest.mark.parametrize("pagesize", [512, 4096, 65536])
def test_rpm_packages_match_rpm_bdb_ro(tmp_path: Path, pagesize: int) -> None:
    db = _rpm_db(tmp_path / "rpm", pagesize)
    ours = {(p.name, p.version, p.arch, p.source) for p in parse_rpm_bdb(db.read_bytes())}
    assert len(ours) == len(PKGS)
    if shutil.which("rpm") is None:
        pytest.skip("rpm not installed (the oracle)")
    out = subprocess.run(
        ["rpm", "--define", "_db_backend bdb_ro", "--dbpath", str(db.parent), "-qa", "--qf",
         "%{NAME}\\t%|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE}\\t%{ARCH}\\t%{SOURCERPM}\\n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    theirs = {tuple(line.split("\t")) for line in out.splitlines()}
    assert {(n, v, a) for n, v, a, _ in ours} == {(n, v, a) for n, v, a, _ in theirs}
    assert ("openssl-libs", "1:1.0.2k-26.el7_9", "x86_64", "openssl-libs") in ours


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.integers(0, 20000), max_size=30),
    pagesize=st.sampled_from([512, 1024, 4096, 16384]),
    seed=st.binary(min_size=1, max_size=8),
)
def test_hash_reader_returns_what_libdb_stored(tmp_path: Path, values: list[int], pagesize: int, seed: bytes) -> None:
    records = {
        struct.pack("<I", i) + seed[: i % len(seed)]: (seed * (n // len(seed) + 1))[:n] for i, n in enumerate(values)
    }
    db = make_hash_db(tmp_path / f"h{len(values)}-{pagesize}.db", records, pagesize=pagesize)
    got = list(read_hash_db(db.read_bytes()))
    assert dict(got) == records and len(got) == len(records)
    db.unlink()


@pytest.fixture(scope="module")
def rpm_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _rpm_db(tmp_path_factory.mktemp("bdb") / "rpm", 1024).read_bytes()


@settings(max_examples=200, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 200_000), st.integers(0, 255)), min_size=1, max_size=8))
def test_corrupt_databases_give_errors_not_crashes(rpm_db: bytes, edits: list[tuple[int, int]]) -> None:
    data = bytearray(rpm_db)
    for pos, byte in edits:
        data[pos % len(data)] = byte
    errors: list[str] = []
    try:
        pkgs = parse_rpm_bdb(bytes(data), on_error=errors.append)
    except ModelFormatError:
        return  # the metadata page itself is broken: nothing to read
    assert len(pkgs) <= len(PKGS) + 8
    assert all(isinstance(e, str) for e in errors)


def test_truncated_database_is_partial(rpm_db: bytes) -> None:
    errors: list[str] = []
    pkgs = parse_rpm_bdb(rpm_db[: len(rpm_db) // 2], on_error=errors.append)
    assert any("cut short" in e for e in errors)
    assert len(pkgs) < len(PKGS)
    with pytest.raises(ModelFormatError, match="cut short"):
        parse_rpm_bdb(rpm_db[: len(rpm_db) // 2])
    with pytest.raises(ModelFormatError, match="magic"):
        parse_rpm_bdb(b"\0" * 4096)


@pytest.mark.slow
def test_centos7_like_image_inventories_rpm_packages(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/redhat-release").write_text("CentOS Linux release 7.9.2009 (Core)\n")
    _rpm_db(root / "var/lib/rpm")
    image = build_image(root, tmp_path / "c7.qcow2", "qcow2", size_mb=32)
    before = sha256(image)
    report = scan_image(image, ScanConfig(rules="none"))
    assert report.error == "" and not report.partial, report.warnings
    assert report.inventory is not None and report.inventory.family == "rhel"
    got = sorted((p.name, p.version) for p in report.inventory.packages if p.kind == "rpm")
    assert got == sorted((n, (f"{e}:" if e else "") + f"{v}-{r}") for n, e, v, r, _ in PKGS)
    assert sha256(image) == before
