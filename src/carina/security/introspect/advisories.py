"""Offline vulnerability data: OSV records and the Debian security tracker's JSON, normalised.

``carina introspect db import DIR...`` reads OSV JSON files (one record, a list
of records, or a ``.zip`` of them as osv.dev publishes) and Debian tracker
JSON (``{source: {CVE: {releases: {codename: {status, fixed_version, urgency}}}}}``)
and writes one normalised database file, atomically.
"""

from __future__ import annotations

import enum
import json
import os
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from carina.core.errors import ModelFormatError

__all__ = ["DB_FORMAT", "Advisory", "Severity", "import_db", "load_db", "parse_debian_tracker", "parse_osv"]

DB_FORMAT = "carina.advisories/1"
DEBIAN_RELEASES = {"buster": "10", "bullseye": "11", "bookworm": "12", "trixie": "13", "forky": "14"}


class Severity(enum.IntEnum):
    """Severity ranks used for thresholds (``unknown`` ranks lowest)."""

    UNKNOWN = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @classmethod
    def parse(cls, text: str | None) -> Severity:
        """Map a label (``high``, ``Moderate``, ``important``, ``unimportant``...) to a rank."""
        t = (text or "").strip().lower()
        aliases = {"moderate": "medium", "important": "high", "unimportant": "low", "negligible": "low"}
        t = aliases.get(t, t)
        return cls[t.upper()] if t.upper() in cls.__members__ else cls.UNKNOWN


@dataclass(frozen=True, kw_only=True)
class Advisory:
    """One affected package of one advisory, normalised.

    Attributes:
        id: Advisory id (``CVE-2023-38408``, ``DSA-5461-1``, ``GHSA-...``).
        package: Package name as the advisory spells it (a *source* name for Debian data).
        ecosystem: OSV ecosystem (``Debian:12``, ``Rocky Linux:9``, ``PyPI``, ``npm``).
        ranges: Each range a tuple of ``(event, version)`` with event ``introduced``,
            ``fixed`` or ``last_affected``.
        versions: Explicitly listed affected versions.
        severity: Label as given (see :class:`Severity`).
        indeterminate: The data itself says the status is not known (tracker ``undetermined``).
        origin: ``osv`` or ``debian-tracker``, and the file it came from.
    """

    id: str
    package: str
    ecosystem: str
    ranges: tuple[tuple[tuple[str, str], ...], ...] = ()
    versions: tuple[str, ...] = ()
    severity: str = "unknown"
    summary: str = ""
    aliases: tuple[str, ...] = ()
    indeterminate: bool = False
    origin: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Advisory:
        """Inverse of ``dataclasses.asdict``."""
        return cls(
            **{
                **d,
                "ranges": tuple(tuple((e, v) for e, v in r) for r in d.get("ranges", ())),
                "versions": tuple(d.get("versions", ())),
                "aliases": tuple(d.get("aliases", ())),
            }
        )


def _str(obj: Any, key: str, where: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, str) or not value:
        raise ModelFormatError(f"missing or non-string {key!r}", file=where)
    return value


def _osv_severity(rec: dict[str, Any], affected: dict[str, Any]) -> str:
    for holder in (affected.get("ecosystem_specific"), affected.get("database_specific"), rec.get("database_specific")):
        if isinstance(holder, dict):
            for key in ("severity", "urgency"):
                if isinstance(holder.get(key), str):
                    return str(holder[key])
    return "unknown"


def parse_osv(rec: Any, *, where: str = "<osv>") -> list[Advisory]:
    """The advisories of one OSV record (none if it is withdrawn).

    Raises:
        ModelFormatError: A required field is missing or has the wrong type.
    """
    if not isinstance(rec, dict):
        raise ModelFormatError("OSV record is not an object", file=where)
    rid = _str(rec, "id", where)
    if rec.get("withdrawn"):
        return []
    affected = rec.get("affected", [])
    if not isinstance(affected, list):
        raise ModelFormatError("'affected' is not a list", file=where)
    out = []
    for i, aff in enumerate(affected):
        at = f"{where}:affected[{i}]"
        pkg = aff.get("package") if isinstance(aff, dict) else None
        ranges = []
        for r in aff.get("ranges", []) if isinstance(aff, dict) else []:
            if not isinstance(r, dict) or r.get("type") == "GIT":
                continue
            events = r.get("events")
            if not isinstance(events, list):
                raise ModelFormatError("range without an events list", file=at)
            ranges.append(tuple(_event(e, at) for e in events))
        versions = aff.get("versions", []) if isinstance(aff, dict) else []
        if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
            raise ModelFormatError("'versions' is not a list of strings", file=at)
        aliases = rec.get("aliases") or []
        out.append(
            Advisory(
                id=rid,
                package=_str(pkg, "name", at),
                ecosystem=_str(pkg, "ecosystem", at),
                ranges=tuple(ranges),
                versions=tuple(versions),
                severity=_osv_severity(rec, aff),
                summary=str(rec.get("summary", ""))[:300],
                aliases=tuple(str(a) for a in aliases) if isinstance(aliases, list) else (),
                origin=f"osv {where}",
            )
        )
    return out


def _event(e: Any, where: str) -> tuple[str, str]:
    if not isinstance(e, dict) or len(e) != 1:
        raise ModelFormatError("range event must have exactly one key", file=where)
    ((kind, version),) = e.items()
    if kind not in ("introduced", "fixed", "last_affected", "limit") or not isinstance(version, str):
        raise ModelFormatError(f"bad range event {e!r}", file=where)
    return kind, version


def parse_debian_tracker(data: Any, *, where: str = "<tracker>") -> list[Advisory]:
    """Advisories of the Debian security tracker's JSON (keyed by *source* package)."""
    if not isinstance(data, dict):
        raise ModelFormatError("tracker JSON is not an object keyed by source package", file=where)
    out = []
    for source, cves in data.items():
        if not isinstance(cves, dict):
            raise ModelFormatError(f"entry of {source!r} is not an object", file=where)
        for cve, info in cves.items():
            releases = info.get("releases", {}) if isinstance(info, dict) else None
            if not isinstance(releases, dict):
                raise ModelFormatError(f"{source}/{cve} lacks 'releases'", file=where)
            for codename, rel in releases.items():
                adv = _tracker_release(source, cve, codename, rel, info, where)
                if adv is not None:
                    out.append(adv)
    return out


def _tracker_release(
    source: str, cve: str, codename: str, rel: Any, info: dict[str, Any], where: str
) -> Advisory | None:
    if not isinstance(rel, dict):
        raise ModelFormatError(f"{source}/{cve}/{codename} is not an object", file=where)
    status, fixed = rel.get("status"), rel.get("fixed_version")
    if fixed == "0" or status == "not-affected":
        return None
    ecosystem = f"Debian:{DEBIAN_RELEASES.get(codename, codename)}"
    events: tuple[tuple[str, str], ...] = (("introduced", "0"),)
    if status == "resolved" and isinstance(fixed, str):
        events += (("fixed", fixed),)
    return Advisory(
        id=cve,
        package=source,
        ecosystem=ecosystem,
        ranges=(events,),
        severity=str(rel.get("urgency", "unknown")).rstrip("*"),
        summary=str(info.get("description", ""))[:300],
        indeterminate=status == "undetermined",
        origin=f"debian-tracker {where}",
    )


def _json_documents(path: Path) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.suffix in (".json", ".zip") and child.is_file():
                yield from _json_documents(child)
        return
    if path.suffix == ".zip":
        try:
            with zipfile.ZipFile(path) as zf:
                for name in sorted(n for n in zf.namelist() if n.endswith(".json")):
                    yield f"{path}!{name}", _loads(zf.read(name), f"{path}!{name}")
        except zipfile.BadZipFile as exc:
            raise ModelFormatError(f"not a zip file: {exc}", file=str(path)) from exc
        return
    yield str(path), _loads(path.read_bytes(), str(path))


def _loads(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        raise ModelFormatError(f"not JSON: {exc}", file=where, line=line) from exc


def _is_osv(doc: Any) -> bool:
    return isinstance(doc, dict) and "id" in doc and ("affected" in doc or "withdrawn" in doc)


def read_sources(paths: Iterable[str | Path]) -> list[Advisory]:
    """Parse every OSV and tracker document under ``paths``."""
    out: list[Advisory] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ModelFormatError("advisory source not found", file=str(p))
        for where, doc in _json_documents(p):
            if isinstance(doc, list):
                for i, rec in enumerate(doc):
                    out += parse_osv(rec, where=f"{where}[{i}]")
            elif _is_osv(doc):
                out += parse_osv(doc, where=where)
            else:
                out += parse_debian_tracker(doc, where=where)
    return out


def import_db(paths: Iterable[str | Path], dest: str | Path) -> Path:
    """Normalise advisory sources into ``dest`` (a file), replacing it atomically.

    Returns:
        The database path.
    """
    advisories = read_sources(paths)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps({"format": DB_FORMAT, "advisories": [asdict(a) for a in advisories]}))
    os.replace(tmp, dest)
    return dest


def load_db(path: str | Path) -> list[Advisory]:
    """Read a database written by :func:`import_db`.

    Raises:
        ModelFormatError: Missing, not JSON, or not a carina advisory database.
    """
    p = Path(path)
    if not p.is_file():
        raise ModelFormatError("advisory database not found (run `carina introspect db import`)", file=str(p))
    doc = _loads(p.read_bytes(), str(p))
    if not isinstance(doc, dict) or doc.get("format") != DB_FORMAT:
        raise ModelFormatError(f"not a {DB_FORMAT} database", file=str(p))
    return [Advisory.from_dict(a) for a in doc["advisories"]]
