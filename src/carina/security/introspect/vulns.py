"""Match an image's packages against normalised advisories.

Rules that scanners get wrong and this module gets right:

* Debian data (OSV ``Debian:*`` and the tracker) names **source** packages and
  source versions: binary ``openssh-server`` built from ``openssh`` matches an
  ``openssh`` advisory, compared at the source version dpkg records.
* Versions compare under the ecosystem's own order (dpkg or rpm; PEP 440 for
  PyPI; numeric dotted for npm), never as strings.
* Withdrawn OSV records are dropped at import; ``config-files`` remnants are
  not installed software and are not matched.
* An advisory for another distribution release does not match.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from carina.core.errors import ModelFormatError
from carina.security.introspect.advisories import Advisory, Severity
from carina.security.introspect.packages import Package
from carina.security.introspect.versions import dpkg_compare, rpm_compare

__all__ = ["Finding", "affected", "match"]

_OS_ECOSYSTEMS = {
    "debian": "Debian",
    "ubuntu": "Ubuntu",
    "rhel": "Red Hat",
    "rocky": "Rocky Linux",
    "almalinux": "AlmaLinux",
    "alpine": "Alpine",
}
_KIND_ECOSYSTEMS = {"pypi": "PyPI", "npm": "npm"}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One vulnerable package."""

    id: str
    package: str
    installed: str
    fixed: str
    severity: str
    rank: int
    advisory_package: str
    ecosystem: str
    indeterminate: bool = False


def _pep440(a: str, b: str) -> int:
    from packaging.version import InvalidVersion, Version

    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion as exc:
        raise ModelFormatError(f"not a PEP 440 version: {exc}") from exc
    return (va > vb) - (va < vb)


def _numeric(a: str, b: str) -> int:
    def key(v: str) -> tuple[tuple[int, ...], int, str]:
        core, _, pre = v.lstrip("v").partition("-")
        nums = tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.+]", core)[:3])
        return nums, 0 if pre else 1, pre

    ka, kb = key(a), key(b)
    return (ka > kb) - (ka < kb)


def _comparator(ecosystem: str) -> Callable[[str, str], int] | None:
    base = ecosystem.split(":", 1)[0]
    if base in ("Debian", "Ubuntu"):
        return dpkg_compare
    if base in ("Red Hat", "Rocky Linux", "AlmaLinux", "openSUSE", "SUSE"):
        return rpm_compare
    return {"PyPI": _pep440, "npm": _numeric}.get(base)


def affected(version: str, adv: Advisory, cmp: Callable[[str, str], int]) -> bool:
    """Whether ``version`` falls in ``adv``'s ranges or listed versions (OSV semantics).

    Events of each range are sorted by version (``introduced: 0`` first); walking
    them in order, ``introduced`` <= v turns "affected" on, ``fixed`` <= v or
    ``last_affected`` < v turns it off.
    """
    if version in adv.versions:
        return True

    def order(a: tuple[str, str], b: tuple[str, str]) -> int:
        if a[1] == "0" or b[1] == "0":
            return (a[1] != "0") - (b[1] != "0")
        return cmp(a[1], b[1])

    for events in adv.ranges:
        state = False
        for kind, v in sorted(events, key=functools.cmp_to_key(order)):
            if kind == "introduced" and (v == "0" or cmp(version, v) >= 0):
                state = True
            elif (kind in ("fixed", "limit") and cmp(version, v) >= 0) or (
                kind == "last_affected" and cmp(version, v) > 0
            ):
                state = False
        if state:
            return True
    return False


def _ecosystem_applies(adv_eco: str, wanted_base: str, release: str) -> bool:
    base, _, rest = adv_eco.partition(":")
    if base != wanted_base:
        return False
    if not rest or not release:
        return True
    first = rest.split(":", 1)[0]
    return first == release or first == release.split(".", 1)[0]


def _fixed_of(adv: Advisory) -> str:
    fixes = [v for r in adv.ranges for k, v in r if k == "fixed"]
    return ",".join(fixes)


def match(packages: Iterable[Package], advisories: Iterable[Advisory], *, os_id: str, os_version: str) -> list[Finding]:
    """Every (package, advisory) pair where the installed version is affected.

    Args:
        packages: The image's packages (from the inventory).
        advisories: Normalised advisories.
        os_id: os-release ``ID`` (selects the distribution ecosystem).
        os_version: os-release ``VERSION_ID`` (selects the release).
    """
    index: dict[tuple[str, str], list[Advisory]] = {}
    for adv in advisories:
        index.setdefault((adv.ecosystem.split(":", 1)[0], adv.package), []).append(adv)
    findings = []
    for pkg in packages:
        if pkg.state not in ("installed", "unknown"):
            continue
        base = _KIND_ECOSYSTEMS.get(pkg.kind) or _OS_ECOSYSTEMS.get(os_id, "")
        release = "" if pkg.kind in _KIND_ECOSYSTEMS else os_version
        by_source = base in ("Debian", "Ubuntu")
        name = pkg.source if by_source else pkg.name
        version = pkg.source_version if by_source else pkg.version
        candidates = index.get((base, name), []) + (index.get((base, pkg.source), []) if not by_source else [])
        seen: set[str] = set()
        for adv in candidates:
            cmp = _comparator(adv.ecosystem)
            if cmp is None or adv.id in seen or not _ecosystem_applies(adv.ecosystem, base, release):
                continue
            try:
                hit = affected(version, adv, cmp)
            except ModelFormatError:
                hit = False  # unparsable version in the advisory: reported as indeterminate below
                findings.append(_finding(pkg, adv, indeterminate=True))
            if hit:
                seen.add(adv.id)
                findings.append(_finding(pkg, adv, indeterminate=adv.indeterminate))
    return sorted(findings, key=lambda f: (-f.rank, f.id, f.package))


def _finding(pkg: Package, adv: Advisory, *, indeterminate: bool) -> Finding:
    return Finding(
        id=adv.id,
        package=pkg.name,
        installed=pkg.version,
        fixed=_fixed_of(adv),
        severity=adv.severity,
        rank=int(Severity.parse(adv.severity)),
        advisory_package=adv.package,
        ecosystem=adv.ecosystem,
        indeterminate=indeterminate,
    )
