"""dpkg and rpm orders agree with the real tools (dpkg --compare-versions, rpm's Lua rpm.vercmp)."""

from __future__ import annotations

import functools
import itertools
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carina.core.errors import ModelFormatError
from carina.security.introspect.versions import dpkg_compare, parse_dpkg, rpm_compare

DPKG_CASES = [
    ("1:0.9", "2.0", 1),
    ("1.0~rc1", "1.0", -1),
    ("1.0~~", "1.0~", -1),
    ("1.0", "1.0+b1", -1),
    ("9.2p1-2+deb12u3", "9.2p1-2", 1),
    ("3.0.11-1~deb12u2", "3.0.11-1~deb12u1", 1),
    ("3.0.11-1~deb12u2", "3.0.11-1", -1),
    ("2.36-9+deb12u4", "2.36-9+deb12u10", -1),
    ("1.0", "1.0-0", 0),
    ("0:1.0", "1.0", 0),
    ("1.01", "1.1", 0),
    ("1.0a", "1.0+", -1),
    ("1.0.", "1.0", 1),
]

RPM_CASES = [
    ("1.0^git1", "1.0", 1),
    ("1.0^git1", "1.0.1", -1),
    ("1.0~rc1", "1.0", -1),
    ("1:1.0", "2.0", 1),
    ("1.0a", "1.0", 1),
    ("1.el8", "1.el8_2", -1),
    ("2.0-1", "2.0", 0),
    ("1.0010", "1.9", 1),
    ("a", "1", -1),
]


@pytest.mark.parametrize(("a", "b", "want"), DPKG_CASES)
def test_dpkg_table(a: str, b: str, want: int) -> None:
    assert dpkg_compare(a, b) == want
    assert dpkg_compare(b, a) == -want


@pytest.mark.parametrize(("a", "b", "want"), RPM_CASES)
def test_rpm_table(a: str, b: str, want: int) -> None:
    assert rpm_compare(a, b) == want
    assert rpm_compare(b, a) == -want


@pytest.mark.parametrize("bad", ["", "a:1.0", "1.0-", "1 0", "1:"])
def test_dpkg_rejects_what_dpkg_rejects(bad: str) -> None:
    with pytest.raises(ModelFormatError):
        parse_dpkg(bad)


_seg = st.sampled_from(["0", "1", "2", "9", "10", "010", "a", "b", "z", "~", "+", ".", "~~", "rc", "p", "deb12u"])
_upstream = st.builds(
    lambda d, rest: d + "".join(rest), st.sampled_from(["0", "1", "2", "10"]), st.lists(_seg, max_size=5)
)
_debver = st.builds(
    lambda e, u, r: (f"{e}:" if e is not None else "") + u + (f"-{r}" if r else ""),
    st.one_of(st.none(), st.integers(0, 2)),
    _upstream,
    st.one_of(st.just(""), st.lists(_seg, min_size=1, max_size=3).map("".join).filter(lambda s: "-" not in s)),
).filter(lambda v: not v.endswith("-"))


def _dpkg_oracle(a: str, b: str) -> int:
    for op, val in (("lt", -1), ("eq", 0)):
        r = subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True, check=False)
        if r.returncode == 0:
            return val
    return 1


@settings(max_examples=60, deadline=None)
@given(_debver, _debver)
def test_dpkg_agrees_with_dpkg(a: str, b: str) -> None:
    assert dpkg_compare(a, b) == _dpkg_oracle(a, b)


@given(st.lists(_debver, min_size=3, max_size=12))
def test_dpkg_is_a_total_order(versions: list[str]) -> None:
    ordered = sorted(versions, key=functools.cmp_to_key(dpkg_compare))
    for x, y in itertools.pairwise(ordered):
        assert dpkg_compare(x, y) <= 0 and dpkg_compare(y, x) >= 0
    assert all(dpkg_compare(v, v) == 0 for v in versions)


_rpmseg = st.sampled_from(["0", "1", "2", "10", "010", "a", "b", "el9", "~", "^", ".", "_", "+", "rc1", "git"])
_rpmver = st.lists(_rpmseg, min_size=1, max_size=6).map("".join).filter(lambda s: any(c.isalnum() for c in s))


@pytest.mark.skipif(shutil.which("rpm") is None, reason="rpm not installed (apt-get install rpm)")
@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(_rpmver, _rpmver), min_size=60, max_size=60))
def test_rpm_agrees_with_rpm(pairs: list[tuple[str, str]]) -> None:
    # One rpm process per batch: rpm.vercmp is rpmvercmp() itself.
    lua = "".join(f'print(rpm.vercmp("{a}", "{b}") .. " ") ' for a, b in pairs)
    out = subprocess.run(["rpm", "--eval", f"%{{lua: {lua}}}"], capture_output=True, text=True, check=True).stdout
    want = [int(x) for x in out.split()]
    from carina.security.introspect.versions import _rpmvercmp

    assert [_rpmvercmp(a, b) for a, b in pairs] == want
