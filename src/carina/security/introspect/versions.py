"""Version ordering of Debian (dpkg) and RPM packages, written from the published algorithms.

Naive comparisons get these wrong: epochs (``1:0.9`` > ``2.0``), tildes
(``1.0~rc1`` < ``1.0``), carets in RPM (``1.0^git1`` > ``1.0``) and backport
suffixes (``9.2p1-2+deb12u3`` > ``9.2p1-2``). Both functions return -1, 0 or 1.
"""

from __future__ import annotations

import enum

from carina.core.errors import ModelFormatError

__all__ = ["VersionScheme", "compare", "dpkg_compare", "parse_dpkg", "rpm_compare", "split_evr"]


class VersionScheme(enum.Enum):
    """Which ordering a package ecosystem uses."""

    DPKG = "dpkg"
    RPM = "rpm"


def parse_dpkg(version: str) -> tuple[int, str, str]:
    """Split a Debian version into ``(epoch, upstream, revision)``.

    Follows dpkg's ``parseversion``: the epoch is the digits before the first
    colon, the revision is what follows the last hyphen.

    Raises:
        ModelFormatError: The string is not a Debian version (dpkg rejects it too).
    """
    v = version.strip()
    if not v or any(c.isspace() for c in v):
        raise ModelFormatError(f"not a Debian version: {version!r}")
    epoch, upstream = 0, v
    if ":" in v:
        head, upstream = v.split(":", 1)
        if not head.isdigit() or not head.isascii():
            raise ModelFormatError(f"epoch of Debian version is not a number: {version!r}")
        epoch = int(head)
    revision = ""
    if "-" in upstream:
        upstream, revision = upstream.rsplit("-", 1)
        if not revision:
            raise ModelFormatError(f"empty revision in Debian version: {version!r}")
    if not upstream:
        raise ModelFormatError(f"empty upstream part in Debian version: {version!r}")
    return epoch, upstream, revision


def _dpkg_order(c: str) -> int:
    if c == "~":
        return -1
    if c.isascii() and c.isdigit():
        return 0
    if c.isascii() and c.isalpha():
        return ord(c)
    return ord(c) + 256


def _isdigit(s: str, i: int) -> bool:
    return i < len(s) and "0" <= s[i] <= "9"


def _dpkg_part(a: str, b: str) -> int:
    """Dpkg's ``verrevcmp``: alternate non-digit and digit runs."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not _isdigit(a, i)) or (j < len(b) and not _isdigit(b, j)):
            ac = _dpkg_order(a[i]) if i < len(a) else 0
            bc = _dpkg_order(b[j]) if j < len(b) else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first_diff = 0
        while _isdigit(a, i) and _isdigit(b, j):
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if _isdigit(a, i):
            return 1
        if _isdigit(b, j):
            return -1
        if first_diff:
            return -1 if first_diff < 0 else 1
    return 0


def dpkg_compare(a: str, b: str) -> int:
    """Compare two Debian versions like ``dpkg --compare-versions`` (-1, 0, 1)."""
    ea, ua, ra = parse_dpkg(a)
    eb, ub, rb = parse_dpkg(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _dpkg_part(ua, ub) or _dpkg_part(ra, rb)


def split_evr(evr: str) -> tuple[str, str, str]:
    """Split an RPM ``[epoch:]version[-release]`` into its three strings (epoch ``"0"`` if absent)."""
    epoch, sep, rest = evr.partition(":")
    if not sep:
        epoch, rest = "0", evr
    version, _, release = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return (epoch or "0"), version, release


def _alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _rpm_special(x: str, i: int, y: str, j: int) -> int | None:
    """Tilde and caret rules of ``rpmvercmp``; None when neither applies."""
    cx, cy = x[i : i + 1], y[j : j + 1]
    if "~" in (cx, cy):
        if cx != "~":
            return 1
        return -1 if cy != "~" else 0
    if "^" in (cx, cy):
        if not cx:
            return -1
        if not cy:
            return 1
        if cx != "^":
            return 1
        return -1 if cy != "^" else 0
    return None


def _rpm_segment(s: str, i: int, digits: bool) -> int:
    while i < len(s) and (_isdigit(s, i) if digits else (s[i].isascii() and s[i].isalpha())):
        i += 1
    return i


def _rpmvercmp(x: str, y: str) -> int:
    """Port of rpm's ``rpmvercmp`` (rpmio/rpmvercmp.c, with ``~`` and ``^``)."""
    if x == y:
        return 0
    i = j = 0
    while i < len(x) or j < len(y):
        while i < len(x) and not _alnum(x[i]) and x[i] not in "~^":
            i += 1
        while j < len(y) and not _alnum(y[j]) and y[j] not in "~^":
            j += 1
        special = _rpm_special(x, i, y, j)
        if special is not None:
            if special:
                return special
            i, j = i + 1, j + 1
            continue
        if i >= len(x) or j >= len(y):
            break
        digits = _isdigit(x, i)
        i2, j2 = _rpm_segment(x, i, digits), _rpm_segment(y, j, digits)
        if j2 == j:
            return 1 if digits else -1
        sx, sy = x[i:i2], y[j:j2]
        if digits:
            sx, sy = sx.lstrip("0"), sy.lstrip("0")
            if len(sx) != len(sy):
                return -1 if len(sx) < len(sy) else 1
        if sx != sy:
            return -1 if sx < sy else 1
        i, j = i2, j2
    if i >= len(x) and j >= len(y):
        return 0
    return -1 if i >= len(x) else 1


def rpm_compare(a: str, b: str) -> int:
    """Compare two RPM EVR strings like ``rpm.labelCompare`` (-1, 0, 1)."""
    ea, va, ra = split_evr(a)
    eb, vb, rb = split_evr(b)
    ei = int(ea) if ea.isascii() and ea.isdigit() else 0
    ej = int(eb) if eb.isascii() and eb.isdigit() else 0
    if ei != ej:
        return -1 if ei < ej else 1
    c = _rpmvercmp(va, vb)
    if c or not ra or not rb:
        return c
    return _rpmvercmp(ra, rb)


def compare(a: str, b: str, scheme: VersionScheme) -> int:
    """Compare ``a`` and ``b`` under ``scheme``."""
    return dpkg_compare(a, b) if scheme is VersionScheme.DPKG else rpm_compare(a, b)
