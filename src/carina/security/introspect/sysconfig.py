"""Parsers of system configuration text read from images: os-release, passwd, group, sshd_config, cron.

All are pure functions over untrusted text: they never raise on odd input but
skip what they cannot read, except where a caller needs to know (noted).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

__all__ = [
    "Group",
    "User",
    "parse_cron",
    "parse_group",
    "parse_kv_release",
    "parse_passwd",
    "parse_sshd_config",
]


def parse_kv_release(text: str) -> dict[str, str]:
    """``KEY=value`` pairs of an os-release file (shell quoting removed)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if not key.replace("_", "").isalnum():
            continue
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value.strip("\"'")]
        out[key] = parts[0] if parts else ""
    return out


@dataclass(frozen=True)
class User:
    """One ``/etc/passwd`` account."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str


@dataclass(frozen=True)
class Group:
    """One ``/etc/group`` group."""

    name: str
    gid: int
    members: tuple[str, ...]


def _int(s: str) -> int | None:
    s = s.strip()
    return int(s) if s.isascii() and s.isdigit() and len(s) < 12 else None


def parse_passwd(text: str) -> list[User]:
    """Accounts of a passwd file; malformed lines are skipped."""
    users = []
    for line in text.splitlines():
        f = line.split(":")
        if len(f) != 7 or not f[0] or line.startswith("#"):
            continue
        uid, gid = _int(f[2]), _int(f[3])
        if uid is None or gid is None:
            continue
        users.append(User(f[0], uid, gid, f[5], f[6]))
    return users


def parse_group(text: str) -> list[Group]:
    """Groups of a group file; malformed lines are skipped."""
    groups = []
    for line in text.splitlines():
        f = line.split(":")
        if len(f) != 4 or not f[0] or line.startswith("#"):
            continue
        gid = _int(f[2])
        if gid is None:
            continue
        groups.append(Group(f[0], gid, tuple(m for m in f[3].split(",") if m)))
    return groups


def parse_sshd_config(text: str) -> list[tuple[str, str]]:
    """Keyword/value lines of an sshd_config up to its first ``Match`` block, in order.

    Keywords are case-insensitive and come back lower-cased; ``include``
    entries are kept in place (sshd reads included files where the keyword
    stands, and the *first* value of a keyword wins).
    """
    items: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        key, value = parts[0], (parts[1] if len(parts) > 1 else "")
        if "=" in key:
            key, _, head = key.partition("=")
            value = f"{head} {value}"
        key, value = key.lower(), value.strip().lstrip("=").strip()
        if key == "match":
            break
        items.append((key, value))
    return items


def parse_cron(text: str, *, system: bool) -> list[str]:
    """Job lines of a crontab (``system`` crontabs carry a user field); comments and env lines dropped."""
    jobs = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        first = line.split()[0]
        if "=" in first and not first.startswith(("@", "*")) and not first[0].isdigit():
            continue  # VAR=value
        fields = 6 if system else 5
        if first.startswith("@"):
            fields = 2 if system else 1
        if len(line.split(None, fields)) > fields:
            jobs.append(line)
    return jobs
