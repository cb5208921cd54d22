"""Compliance rules in YAML, evaluated against an image's inventory and files.

A rule file is ``{rules: [rule, ...]}``; each rule has ``id``, ``title``,
``severity``, optional ``families`` (``debian``, ``rhel``, ``alpine``) and
exactly one check::

    sshd:          {key: permitrootlogin, allowed: [no, prohibit-password], default: prohibit-password}
    file_content:  {path: /etc/shadow, pattern: '^[^:]+::', expect: absent}
    file_mode:     {path: /etc/shadow, max: "0640", owner: 0}
    package:       {name: telnetd, state: absent}
    service:       {name: ssh.service, state: enabled}
    world_writable: {}

The CIS-style starter set ships as :data:`STARTER_RULES` (``starter_rules.yaml``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from carina.core.errors import ModelFormatError
from carina.security.introspect.image import ImageView
from carina.security.introspect.inventory import Inventory

__all__ = ["Rule", "RuleResult", "Status", "evaluate", "load_rules", "starter_rules"]

_CHECKS = ("sshd", "file_content", "file_mode", "package", "service", "world_writable")
_REQUIRED = {
    "sshd": ("key", "allowed"),
    "file_content": ("path", "pattern"),
    "file_mode": ("path",),
    "package": ("name",),
    "service": ("name",),
    "world_writable": (),
}


class Status(enum.Enum):
    """Outcome of one rule."""

    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not_applicable"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One compliance rule."""

    id: str
    title: str
    severity: str
    check: str
    params: dict[str, Any]
    families: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RuleResult:
    """A rule's outcome with the evidence behind it."""

    id: str
    title: str
    severity: str
    status: Status
    evidence: str


def load_rules(text: str, *, file: str = "<rules>") -> list[Rule]:
    """Parse a YAML rule file.

    Raises:
        ModelFormatError: Not YAML, or a rule is malformed (names the rule's line).
    """
    import yaml

    try:
        doc = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ModelFormatError(f"not YAML: {exc}", file=file, line=mark.line + 1 if mark else None) from exc
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ModelFormatError("a rule file is a mapping with a 'rules' list", file=file, line=1)
    lines = _rule_lines(doc)
    return [_rule(r, file, lines[i] if i < len(lines) else None) for i, r in enumerate(data["rules"])]


def _rule_lines(doc: Any) -> list[int]:
    try:
        for key, value in doc.value:
            if key.value == "rules":
                return [item.start_mark.line + 1 for item in value.value]
    except (AttributeError, TypeError):
        pass
    return []


def _rule(r: Any, file: str, line: int | None) -> Rule:
    if not isinstance(r, dict):
        raise ModelFormatError("rule is not a mapping", file=file, line=line)
    for key in ("id", "title", "severity"):
        if not isinstance(r.get(key), str):
            raise ModelFormatError(f"rule lacks string {key!r}", file=file, line=line)
    checks = [c for c in _CHECKS if c in r]
    unknown = set(r) - {"id", "title", "severity", "families", *_CHECKS}
    if len(checks) != 1 or unknown:
        raise ModelFormatError(
            f"rule {r['id']!r} needs exactly one check of {_CHECKS} (unknown keys: {sorted(unknown)})",
            file=file,
            line=line,
        )
    params = r[checks[0]] or {}
    if not isinstance(params, dict):
        raise ModelFormatError(f"rule {r['id']!r}: check parameters must be a mapping", file=file, line=line)
    missing = [k for k in _REQUIRED[checks[0]] if k not in params]
    if missing:
        raise ModelFormatError(f"rule {r['id']!r}: {checks[0]} needs {missing[0]!r}", file=file, line=line)
    if "max" in params and not re.fullmatch(r"0?[0-7]{3,4}", str(params["max"])):
        raise ModelFormatError(f"rule {r['id']!r}: max must be an octal mode", file=file, line=line)
    if "pattern" in params:
        try:
            re.compile(str(params["pattern"]))
        except re.error as exc:
            raise ModelFormatError(f"rule {r['id']!r}: bad pattern: {exc}", file=file, line=line) from exc
    fams = r.get("families") or []
    return Rule(
        id=r["id"], title=r["title"], severity=r["severity"], check=checks[0], params=params, families=tuple(fams)
    )


def starter_rules() -> list[Rule]:
    """The CIS-style starter set for Debian/Ubuntu and RHEL-family systems."""
    text = resources.files("carina.security.introspect").joinpath("starter_rules.yaml").read_text()
    return load_rules(text, file="starter_rules.yaml")


def evaluate(rules: list[Rule], inv: Inventory, view: ImageView) -> list[RuleResult]:
    """Evaluate ``rules`` on one image."""
    out = []
    for rule in rules:
        if rule.families and inv.family not in rule.families:
            out.append(_result(rule, Status.NOT_APPLICABLE, f"family {inv.family}"))
            continue
        status, evidence = _CHECK_FUNCS[rule.check](rule.params, inv, view)
        out.append(_result(rule, status, evidence))
    return out


def _result(rule: Rule, status: Status, evidence: str) -> RuleResult:
    return RuleResult(id=rule.id, title=rule.title, severity=rule.severity, status=status, evidence=evidence)


def _verdict(ok: bool, evidence: str) -> tuple[Status, str]:
    return (Status.PASS if ok else Status.FAIL), evidence


def _check_sshd(p: dict[str, Any], inv: Inventory, view: ImageView) -> tuple[Status, str]:
    if not any(pkg.name in ("openssh-server", "openssh") for pkg in inv.packages) and not inv.sshd:
        return Status.NOT_APPLICABLE, "no ssh server installed"
    key = str(p["key"]).lower()
    value = inv.sshd.get(key, str(p.get("default", "")))
    allowed = [str(a).lower() for a in p.get("allowed", [])]
    return _verdict(value.lower() in allowed, f"{key} {value}")


def _check_file_content(p: dict[str, Any], inv: Inventory, view: ImageView) -> tuple[Status, str]:
    text = view.read_text(str(p["path"]))
    if text is None:
        return Status.NOT_APPLICABLE, f"{p['path']} absent"
    m = re.search(str(p["pattern"]), text, re.MULTILINE)
    expect_present = p.get("expect", "present") == "present"
    where = f"{p['path']}: {m.group(0)[:80]!r}" if m else f"{p['path']}: no match"
    return _verdict(bool(m) == expect_present, where)


def _check_file_mode(p: dict[str, Any], inv: Inventory, view: ImageView) -> tuple[Status, str]:
    path = str(p["path"])
    if path not in inv.file_modes:
        return Status.NOT_APPLICABLE, f"{path} absent"
    mode, uid, gid = inv.file_modes[path]
    problems = []
    if "max" in p and mode & ~int(str(p["max"]), 8):
        problems.append(f"mode {mode:04o} exceeds {p['max']}")
    if "owner" in p and uid != int(p["owner"]):
        problems.append(f"owner {uid} != {p['owner']}")
    if "group" in p and gid != int(p["group"]):
        problems.append(f"group {gid} != {p['group']}")
    return _verdict(not problems, "; ".join(problems) or f"{path} {mode:04o} {uid}:{gid}")


def _check_package(p: dict[str, Any], inv: Inventory, view: ImageView) -> tuple[Status, str]:
    present = any(pkg.name == p["name"] and pkg.state == "installed" for pkg in inv.packages)
    want = p.get("state", "present") == "present"
    return _verdict(present == want, f"{p['name']} {'installed' if present else 'not installed'}")


def _check_service(p: dict[str, Any], inv: Inventory, view: ImageView) -> tuple[Status, str]:
    enabled = p["name"] in inv.services
    want = p.get("state", "enabled") == "enabled"
    return _verdict(enabled == want, f"{p['name']} {'enabled' if enabled else 'not enabled'}")


def _check_world_writable(p: dict[str, Any], inv: Inventory, view: ImageView) -> tuple[Status, str]:
    return _verdict(not inv.world_writable, ", ".join(inv.world_writable[:10]) or "none")


_CHECK_FUNCS = {
    "sshd": _check_sshd,
    "file_content": _check_file_content,
    "file_mode": _check_file_mode,
    "package": _check_package,
    "service": _check_service,
    "world_writable": _check_world_writable,
}
