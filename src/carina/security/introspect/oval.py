"""Export carina's Debian advisories as OVAL definitions, so OpenSCAP can check what carina matched.

For one image's release, each (advisory, binary package) pair becomes one
``vulnerability`` definition: the advisory's OSV ranges turn into intervals of
``dpkginfo_test`` s on the binary's ``evr`` (``debian_evr_string``, OVAL 5.11.2),
its explicit versions into equality tests. Binary names come from the image's
inventory (Debian advisories name *source* packages; an OVAL ``dpkginfo_object``
needs the binary). Indeterminate advisories (the tracker's ``undetermined``) are
left out. OpenSCAP then compares versions with its own (APT's) dpkg order and reads
the installed versions itself, so :func:`advisory_oval` plus ``oscap oval eval`` is an
independent check of carina's version comparison and matching. It is not identical
to carina's rules in one way, by construction: OVAL compares the *binary* version,
carina the *source* version (they differ for binNMUs such as ``5.2.15-2+b2``).
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from carina.core.errors import ModelFormatError
from carina.security.introspect.advisories import Advisory
from carina.security.introspect.packages import Package
from carina.security.introspect.versions import dpkg_compare

__all__ = ["advisory_oval", "intervals"]

_NS = "http://oval.mitre.org/XMLSchema/oval-definitions-5"
_COMMON = "http://oval.mitre.org/XMLSchema/oval-common-5"
_LINUX = "http://oval.mitre.org/XMLSchema/oval-definitions-5#linux"
Interval = tuple[tuple[str, str] | None, tuple[str, str] | None]  # (lower (op, v), upper (op, v))


def intervals(adv: Advisory) -> list[Interval]:
    """The affected version intervals of ``adv`` (OSV semantics, dpkg order), plus its listed versions."""

    def order(a: tuple[str, str], b: tuple[str, str]) -> int:
        if a[1] == "0" or b[1] == "0":
            return (a[1] != "0") - (b[1] != "0")
        return dpkg_compare(a[1], b[1])

    out: list[Interval] = [(("equals", v), None) for v in adv.versions]
    for events in adv.ranges:
        low: tuple[str, str] | None = None
        open_ = False
        for kind, v in sorted(events, key=functools.cmp_to_key(order)):
            if kind == "introduced" and not open_:
                low, open_ = (None if v == "0" else ("greater than or equal", v)), True
            elif kind in ("fixed", "limit", "last_affected") and open_:
                out.append((low, ("less than or equal" if kind == "last_affected" else "less than", v)))
                open_ = False
        if open_:
            out.append((low, None))
    return out


def _evr(version: str) -> str:
    return version if ":" in version else f"0:{version}"


class _Doc:
    """Accumulates tests, objects and states, each written once."""

    def __init__(self) -> None:
        ET.register_namespace("", _NS)
        ET.register_namespace("oval", _COMMON)
        ET.register_namespace("linux-def", _LINUX)
        self.root = ET.Element(f"{{{_NS}}}oval_definitions")
        gen = ET.SubElement(self.root, f"{{{_NS}}}generator")
        for tag, text in (
            ("product_name", "carina"),
            ("schema_version", "5.11.2"),
            ("timestamp", "2026-01-01T00:00:00"),
        ):
            ET.SubElement(gen, f"{{{_COMMON}}}{tag}").text = text
        self.sections = {
            n: ET.SubElement(self.root, f"{{{_NS}}}{n}") for n in ("definitions", "tests", "objects", "states")
        }
        self.ids: dict[tuple[str, ...], str] = {}

    def _id(self, kind: str, key: tuple[str, ...]) -> tuple[str, bool]:
        full = (kind, *key)
        if full in self.ids:
            return self.ids[full], False
        self.ids[full] = f"oval:org.carina:{kind}:{len(self.ids) + 1}"
        return self.ids[full], True

    def test(self, binary: str, bound: tuple[str, str] | None) -> str:
        obj, new = self._id("obj", (binary,))
        if new:
            el = ET.SubElement(self.sections["objects"], f"{{{_LINUX}}}dpkginfo_object", id=obj, version="1")
            ET.SubElement(el, f"{{{_LINUX}}}name").text = binary
        tst, new = self._id("tst", (binary, *(bound or ())))
        if new:
            el = ET.SubElement(
                self.sections["tests"], f"{{{_LINUX}}}dpkginfo_test", id=tst, version="1", check="all",
                check_existence="at_least_one_exists", comment=f"{binary} {bound or 'installed'}",
            )  # fmt: skip
            ET.SubElement(el, f"{{{_LINUX}}}object", object_ref=obj)
            if bound is not None:
                ste, new_state = self._id("ste", bound)
                if new_state:
                    st = ET.SubElement(self.sections["states"], f"{{{_LINUX}}}dpkginfo_state", id=ste, version="1")
                    evr = ET.SubElement(st, f"{{{_LINUX}}}evr", datatype="debian_evr_string", operation=bound[0])
                    evr.text = _evr(bound[1])
                ET.SubElement(el, f"{{{_LINUX}}}state", state_ref=ste)
        return tst

    def definition(self, adv: Advisory, binary: str, spans: list[Interval]) -> str:
        did, _ = self._id("def", (adv.id, binary))
        el = ET.SubElement(self.sections["definitions"], f"{{{_NS}}}definition", id=did, version="1")
        el.set("class", "vulnerability")
        meta = ET.SubElement(el, f"{{{_NS}}}metadata")
        ET.SubElement(meta, f"{{{_NS}}}title").text = f"{adv.id} {binary}"
        ET.SubElement(meta, f"{{{_NS}}}description").text = adv.summary or f"{adv.package} ({adv.ecosystem})"
        top = ET.SubElement(el, f"{{{_NS}}}criteria", operator="OR")
        for low, high in spans:
            both = ET.SubElement(top, f"{{{_NS}}}criteria", operator="AND")
            bounds: list[tuple[str, str] | None] = [b for b in (low, high) if b is not None]
            for bound in bounds or [None]:  # no bound: any installed version
                ET.SubElement(both, f"{{{_NS}}}criterion", test_ref=self.test(binary, bound))
        return did


def advisory_oval(
    advisories: Iterable[Advisory], packages: Iterable[Package], *, os_version: str
) -> tuple[str, dict[str, tuple[str, str]]]:
    """OVAL definitions for the Debian advisories of release ``os_version`` that name a source in ``packages``.

    Returns:
        The OVAL document, and each definition id's ``(advisory id, binary package)``.

    Raises:
        ModelFormatError: An advisory's version cannot be ordered.
    """
    binaries: dict[str, set[str]] = {}
    for p in packages:
        if p.kind == "deb":
            binaries.setdefault(p.source or p.name, set()).add(p.name)
    doc, names = _Doc(), {}
    for adv in advisories:
        base, _, release = adv.ecosystem.partition(":")
        if (
            base != "Debian"
            or adv.indeterminate
            or (release and release.partition(":")[0] != os_version.partition(".")[0])
        ):
            continue
        try:
            spans = intervals(adv)
        except ModelFormatError:
            continue
        if not spans:
            continue
        for binary in sorted(binaries.get(adv.package, ())):
            names[doc.definition(adv, binary, spans)] = (adv.id, binary)
    ET.indent(doc.root)
    return ET.tostring(doc.root, encoding="unicode", xml_declaration=True), names
