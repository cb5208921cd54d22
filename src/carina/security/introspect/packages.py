"""Parsers of package databases found in disk images: dpkg, rpm (sqlite), apk.

Each parser takes the raw bytes of a database and returns :class:`Package`
records. Input is untrusted: a malformed record raises
:class:`~carina.core.errors.ModelFormatError` with the file and line (or
record number); nothing here touches the host.
"""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Callable
from dataclasses import dataclass

from carina.core.errors import ModelFormatError

__all__ = [
    "Package",
    "parse_apk_installed",
    "parse_deb822",
    "parse_dpkg_status",
    "parse_rpm_bdb",
    "parse_rpm_header",
    "parse_rpmdb",
]

#: Longest field value or record a database may hold before it is called hostile.
MAX_FIELD = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Package:
    """One installed package.

    Attributes:
        name: Binary package name.
        version: Full version (``epoch:upstream-revision`` for dpkg, ``E:V-R`` for rpm).
        kind: ``deb``, ``rpm``, ``apk``, ``pypi`` or ``npm`` (the purl type).
        arch: Architecture, empty if unknown.
        source: Source package name (dpkg ``Source:``; rpm source RPM name), else ``name``.
        source_version: Version of the source package (may differ from ``version`` on binNMUs).
        location: Where in the image it was found.
        state: dpkg's status word (``installed``, ``config-files``, ...); ``installed`` elsewhere.
    """

    name: str
    version: str
    kind: str
    arch: str = ""
    source: str = ""
    source_version: str = ""
    location: str = ""
    state: str = "installed"


def parse_deb822(text: str, *, file: str = "<deb822>") -> list[tuple[int, dict[str, str]]]:
    """Split deb822 text into paragraphs of ``{Field: value}`` with their first line number.

    Raises:
        ModelFormatError: A line is neither ``Field: value`` nor a continuation.
    """
    paragraphs: list[tuple[int, dict[str, str]]] = []
    current: dict[str, str] = {}
    start, last = 0, ""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if current:
                paragraphs.append((start, current))
            current, last = {}, ""
            continue
        if line[0] in " \t":
            if not last:
                raise ModelFormatError("continuation line before any field", file=file, line=lineno)
            if len(current[last]) < MAX_FIELD:
                current[last] += "\n" + line.strip()
            continue
        field, sep, value = line.partition(":")
        if not sep or not field or any(c.isspace() for c in field):
            raise ModelFormatError(f"malformed line {line[:40]!r}", file=file, line=lineno)
        if not current:
            start = lineno
        current[field] = value.strip()
        last = field
    if current:
        paragraphs.append((start, current))
    return paragraphs


def parse_dpkg_status(text: str, *, file: str = "/var/lib/dpkg/status") -> list[Package]:
    """Installed packages of a dpkg ``status`` file (as ``dpkg-query -W`` lists them).

    ``dpkg-query -W`` lists every paragraph whose status is not ``not-installed``
    (``config-files`` included); this does the same, so the two agree on any tree.
    """
    out = []
    for lineno, para in parse_deb822(text, file=file):
        name = para.get("Package")
        if not name:
            raise ModelFormatError("paragraph without Package field", file=file, line=lineno)
        status = para.get("Status", "").split()
        state = status[2] if len(status) == 3 else "unknown"
        if state == "not-installed":
            continue
        version = para.get("Version", "")
        source, source_version = name, version
        if src := para.get("Source"):
            source, _, rest = src.partition(" ")
            source_version = rest.strip().strip("()").strip() or version
        out.append(
            Package(
                name=name,
                version=version,
                kind="deb",
                arch=para.get("Architecture", ""),
                source=source,
                source_version=source_version,
                location=f"{file}:{lineno}",
                state=state,
            )
        )
    return out


def parse_apk_installed(text: str, *, file: str = "/lib/apk/db/installed") -> list[Package]:
    """Packages of Alpine's ``installed`` database (``P:`` name, ``V:`` version, ``A:`` arch, ``o:`` origin)."""
    out: list[Package] = []
    fields: dict[str, str] = {}
    start = 1
    for lineno, line in enumerate([*text.splitlines(), ""], 1):
        if not line.strip():
            if fields:
                if "P" not in fields or "V" not in fields:
                    raise ModelFormatError("apk record lacks P: or V:", file=file, line=start)
                out.append(
                    Package(
                        name=fields["P"],
                        version=fields["V"],
                        kind="apk",
                        arch=fields.get("A", ""),
                        source=fields.get("o", fields["P"]),
                        source_version=fields["V"],
                        location=f"{file}:{start}",
                    )
                )
            fields = {}
            continue
        key, sep, value = line.partition(":")
        if not sep or len(key) != 1:
            raise ModelFormatError(f"malformed apk line {line[:40]!r}", file=file, line=lineno)
        if not fields:
            start = lineno
        fields.setdefault(key, value)
    return out


# -- rpm ---------------------------------------------------------------------

_TAGS = {1000: "name", 1001: "version", 1002: "release", 1003: "epoch", 1022: "arch", 1044: "sourcerpm"}
_STRING, _INT32, _I18N = 6, 4, 9


def parse_rpm_header(blob: bytes, *, where: str = "<rpm header>") -> dict[str, str]:
    """Decode the tags carina needs from one RPM header blob (as stored in rpmdb.sqlite).

    Layout: big-endian ``il`` (index entries) and ``dl`` (data bytes), ``il``
    16-byte entries ``(tag, type, offset, count)``, then the data store.

    Raises:
        ModelFormatError: The blob is truncated or an entry points outside the data.
    """
    if len(blob) < 8:
        raise ModelFormatError("rpm header shorter than its preamble", file=where)
    il, dl = struct.unpack_from(">II", blob, 0)
    data_start = 8 + 16 * il
    if il > 100_000 or dl > MAX_FIELD * 64 or data_start + dl > len(blob):
        raise ModelFormatError(f"rpm header claims {il} entries / {dl} bytes beyond its size", file=where)
    data = blob[data_start : data_start + dl]
    out: dict[str, str] = {}
    for k in range(il):
        tag, typ, off, count = struct.unpack_from(">IIiI", blob, 8 + 16 * k)
        name = _TAGS.get(tag)
        if name is None:
            continue
        if off < 0 or off >= len(data):
            raise ModelFormatError(f"rpm tag {tag} points outside the header data", file=where)
        if typ in (_STRING, _I18N):
            end = data.find(b"\0", off)
            if end < 0:
                raise ModelFormatError(f"rpm tag {tag} string is not terminated", file=where)
            out[name] = data[off:end].decode("utf-8", "replace")
        elif typ == _INT32 and count >= 1 and off + 4 <= len(data):
            out[name] = str(struct.unpack_from(">i", data, off)[0])
    return out


def _source_name(srpm: str) -> str:
    # "openssl-3.0.7-24.el9.src.rpm" -> "openssl"
    base = srpm.removesuffix(".rpm").removesuffix(".src").removesuffix(".nosrc")
    parts = base.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else base


def parse_rpmdb(path: str, *, where: str = "/var/lib/rpm/rpmdb.sqlite") -> list[Package]:
    """Packages of an rpm sqlite database, a copy of which lies at ``path`` on the host.

    Raises:
        ModelFormatError: Not an rpm sqlite database, or a header is malformed.
    """
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            rows = con.execute("SELECT hnum, blob FROM Packages").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise ModelFormatError(f"not an rpm sqlite database: {exc}", file=where) from exc
    return [p for hnum, blob in rows if (p := _rpm_package(bytes(blob), f"{where}#{hnum}")) is not None]


def _rpm_package(blob: bytes, location: str) -> Package | None:
    tags = parse_rpm_header(blob, where=location)
    if "name" not in tags or "version" not in tags:
        return None  # gpg-pubkey pseudo-packages have names; truly empty headers are skipped
    evr = tags["version"] + (f"-{tags['release']}" if tags.get("release") else "")
    if tags.get("epoch", "0") not in ("", "0"):
        evr = f"{tags['epoch']}:{evr}"
    return Package(
        name=tags["name"],
        version=evr,
        kind="rpm",
        arch=tags.get("arch", ""),
        source=_source_name(tags["sourcerpm"]) if tags.get("sourcerpm") else tags["name"],
        source_version=evr,
        location=location,
    )


def parse_rpm_bdb(
    data: bytes, *, where: str = "/var/lib/rpm/Packages", on_error: Callable[[str], None] | None = None
) -> list[Package]:
    """Packages of an rpm Berkeley DB ``Packages`` file (RHEL/CentOS <= 8), from its bytes.

    Key 0 (rpm's bookkeeping record) is skipped; every other value is a header.
    With ``on_error``, a broken page or header is reported there and skipped
    (the rest is still read); without, it raises.

    Raises:
        ModelFormatError: The file is not a hash database, or (without ``on_error``) breaks the format.
    """
    from carina.security.introspect.bdb import read_hash_db

    out = []
    for key, value in read_hash_db(data, where=where, on_error=on_error):
        hnum = int.from_bytes(key, "little") if len(key) == 4 else -1
        if hnum == 0:
            continue
        try:
            pkg = _rpm_package(value, f"{where}#{hnum}")
        except ModelFormatError as exc:
            if on_error is None:
                raise
            on_error(str(exc))
            continue
        if pkg is not None:
            out.append(pkg)
    return out
