"""Package-database and config parsers: agreement with dpkg-query, and fuzzing with hostile input."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from introspect_images import dpkg_query

from carina.core.errors import ModelFormatError
from carina.security.introspect.advisories import parse_debian_tracker, parse_osv
from carina.security.introspect.compliance import load_rules
from carina.security.introspect.packages import (
    parse_apk_installed,
    parse_dpkg_status,
    parse_rpm_header,
)
from carina.security.introspect.sysconfig import parse_cron, parse_kv_release, parse_passwd, parse_sshd_config
from carina.testing.introspect import DebPkg, FakeDebian, write_tree

_name = st.from_regex(r"[a-z0-9][a-z0-9+.-]{1,12}", fullmatch=True)
_version = st.from_regex(r"([1-9]:)?[0-9][0-9a-z.+~]{0,8}(-[0-9a-z.+~]{1,5})?", fullmatch=True)
_state = st.sampled_from(["installed", "installed", "config-files", "half-installed", "unpacked"])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_name, _version, _state), min_size=1, max_size=8, unique_by=lambda t: t[0]))
def test_dpkg_status_agrees_with_dpkg_query(tmp_path_factory: pytest.TempPathFactory, pkgs) -> None:
    root = write_tree(
        tmp_path_factory.mktemp("tree"),
        FakeDebian(packages=[DebPkg(name=n, version=v, state=s) for n, v, s in pkgs]),
    )
    ours = parse_dpkg_status((root / "var/lib/dpkg/status").read_text())
    assert {(p.name, p.version, p.arch) for p in ours} == dpkg_query(root)


def test_dpkg_status_errors_point_at_lines() -> None:
    with pytest.raises(ModelFormatError) as exc:
        parse_dpkg_status("Package: a\nVersion: 1\n\n continuation without field\n", file="status")
    assert exc.value.context == {"file": "status", "line": 4}
    with pytest.raises(ModelFormatError, match="without Package"):
        parse_dpkg_status("Version: 1\n")


@given(st.text(max_size=400))
def test_deb822_parsers_never_crash(text: str) -> None:
    for parse in (parse_dpkg_status, parse_apk_installed):
        try:
            parse(text)
        except ModelFormatError:
            pass


@given(st.binary(max_size=300))
def test_rpm_header_never_crashes(blob: bytes) -> None:
    try:
        parse_rpm_header(blob)
    except ModelFormatError:
        pass


def test_rpm_header_bounds_are_checked() -> None:
    blob = struct.pack(">II", 1, 4) + struct.pack(">IIiI", 1000, 6, 100, 1) + b"abc\0"
    with pytest.raises(ModelFormatError, match="outside"):
        parse_rpm_header(blob)
    with pytest.raises(ModelFormatError, match="beyond"):
        parse_rpm_header(struct.pack(">II", 10**6, 10))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=20,
)


@given(_json)
def test_advisory_parsers_never_crash(doc) -> None:
    for parse in (parse_osv, parse_debian_tracker):
        try:
            parse(doc)
        except ModelFormatError:
            pass


@given(st.text(max_size=300))
def test_config_parsers_never_crash(text: str) -> None:
    parse_kv_release(text)
    parse_passwd(text)
    parse_sshd_config(text)
    parse_cron(text, system=True)


@given(st.text(max_size=300))
def test_rule_loader_never_crashes(text: str) -> None:
    try:
        load_rules(text)
    except ModelFormatError:
        pass


def test_sshd_first_value_wins_and_match_ends_globals() -> None:
    items = parse_sshd_config("PermitRootLogin=no\npermitrootlogin yes\nMatch all\nX11Forwarding yes\n")
    assert items == [("permitrootlogin", "no"), ("permitrootlogin", "yes")]


def test_os_release_quoting() -> None:
    assert parse_kv_release('ID="rhel"\nID_LIKE="fedora centos"\n# c\nBAD LINE\n') == {
        "ID": "rhel",
        "ID_LIKE": "fedora centos",
    }


def test_tree_has_a_real_status_file(tmp_path: Path) -> None:
    root = write_tree(tmp_path, FakeDebian())
    assert ("openssh-server", "1:9.2p1-2+deb12u2", "amd64") in dpkg_query(root)
