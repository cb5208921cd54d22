"""What is installed and configured in an image: OS, kernels, packages, accounts, services, risky files."""

from __future__ import annotations

import fnmatch
import json
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from carina.core.errors import ModelFormatError
from carina.security.introspect.image import ImageView
from carina.security.introspect.packages import (
    Package,
    parse_apk_installed,
    parse_dpkg_status,
    parse_rpm_bdb,
    parse_rpmdb,
)
from carina.security.introspect.sysconfig import (
    parse_cron,
    parse_group,
    parse_kv_release,
    parse_passwd,
    parse_sshd_config,
)

__all__ = ["Inventory", "collect_inventory"]

_RPMDBS = ("/var/lib/rpm/rpmdb.sqlite", "/usr/lib/sysimage/rpm/rpmdb.sqlite")
_RPM_BDB = "/var/lib/rpm/Packages"  # Berkeley DB hash, RHEL/CentOS <= 8
_SITE_DIRS = ("/usr/lib", "/usr/local/lib")
_NPM_DIRS = ("/usr/lib/node_modules", "/usr/local/lib/node_modules")
_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@dataclass(kw_only=True)
class Inventory:
    """Everything a scan learned about one image (JSON-serialisable via :meth:`to_dict`)."""

    os: dict[str, str] = field(default_factory=dict)
    kernels: list[str] = field(default_factory=list)
    packages: list[Package] = field(default_factory=list)
    users: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    sudoers: list[str] = field(default_factory=list)
    sshd: dict[str, str] = field(default_factory=dict)
    authorized_keys: dict[str, int] = field(default_factory=dict)
    services: list[str] = field(default_factory=list)
    cron: list[str] = field(default_factory=list)
    setuid: list[str] = field(default_factory=list)
    world_writable: list[str] = field(default_factory=list)
    file_modes: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """``debian``, ``rhel``, ``alpine`` or ``unknown`` (from os-release ID/ID_LIKE)."""
        ids = {self.os.get("ID", ""), *self.os.get("ID_LIKE", "").split()}
        if ids & {"debian", "ubuntu"}:
            return "debian"
        if ids & {"rhel", "fedora", "centos", "rocky", "almalinux"}:
            return "rhel"
        return "alpine" if "alpine" in ids else "unknown"

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        d = asdict(self)
        d["family"] = self.family
        d.pop("file_modes")
        return d


def collect_inventory(view: ImageView) -> Inventory:
    """Read everything :class:`Inventory` holds from ``view`` (warnings go to ``view.warnings``)."""
    inv = Inventory()
    inv.os = _os_release(view)
    inv.kernels = sorted(
        {n.removeprefix("vmlinuz-") for n in view.listdir("/boot") if n.startswith("vmlinuz-")}
        | set(view.listdir("/lib/modules"))
        | set(view.listdir("/usr/lib/modules"))
    )
    inv.packages = _system_packages(view) + _language_packages(view)
    _accounts(view, inv)
    inv.sshd = _sshd(view)
    inv.services = _services(view)
    inv.cron = _cron(view)
    _risky_files(view, inv)
    return inv


def _os_release(view: ImageView) -> dict[str, str]:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = view.read_text(path)
        if text:
            return parse_kv_release(text)
    for path, ident in (("/etc/redhat-release", "rhel"), ("/etc/alpine-release", "alpine")):
        text = view.read_text(path)
        if text:
            return {"ID": ident, "PRETTY_NAME": text.strip()}
    return {}


def _guarded(view: ImageView, path: str, parse: Any) -> list[Package]:
    try:
        return list(parse())
    except ModelFormatError as exc:
        view.warn(f"{path}: {exc}")
        return []


def _system_packages(view: ImageView) -> list[Package]:
    pkgs: list[Package] = []
    status = view.read_text("/var/lib/dpkg/status")
    if status is not None:
        pkgs += _guarded(view, "/var/lib/dpkg/status", lambda: parse_dpkg_status(status))
    apk = view.read_text("/lib/apk/db/installed")
    if apk is not None:
        pkgs += _guarded(view, "/lib/apk/db/installed", lambda: parse_apk_installed(apk))
    for path in _RPMDBS:
        blob = view.read_bytes(path)
        if blob is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:  # sqlite needs a file; this copy is ours
            copy = Path(tmp) / "rpmdb.sqlite"
            copy.write_bytes(blob)
            pkgs += _guarded(view, path, lambda c=copy, p=path: parse_rpmdb(str(c), where=p))
        break
    else:
        bdb = view.read_bytes(_RPM_BDB)
        if bdb is not None:
            pkgs += _guarded(view, _RPM_BDB, lambda b=bdb: parse_rpm_bdb(b, where=_RPM_BDB, on_error=view.warn))
    return pkgs


def _language_packages(view: ImageView) -> list[Package]:
    out: list[Package] = []
    for base in _SITE_DIRS:
        for py in (n for n in view.listdir(base) if n.startswith("python")):
            for site in ("site-packages", "dist-packages"):
                d = f"{base}/{py}/{site}"
                for name in view.listdir(d):
                    meta = {".dist-info": "METADATA", ".egg-info": "PKG-INFO"}
                    for suffix, fname in meta.items():
                        if name.endswith(suffix):
                            out += _pip_package(view, f"{d}/{name}/{fname}")
    for base in _NPM_DIRS:
        for name in view.listdir(base):
            subdirs = [f"{name}/{s}" for s in view.listdir(f"{base}/{name}")] if name.startswith("@") else [name]
            for sub in subdirs:
                out += _npm_package(view, f"{base}/{sub}/package.json")
    return out


def _pip_package(view: ImageView, path: str) -> list[Package]:
    text = view.read_text(path)
    if not text:
        return []
    header = text.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in header.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields.setdefault(key, value.strip())
    if "Name" not in fields or "Version" not in fields:
        view.warn(f"{path}: no Name/Version")
        return []
    name = fields["Name"].lower().replace("_", "-")
    return [Package(name=name, version=fields["Version"], kind="pypi", source=name, location=path)]


def _npm_package(view: ImageView, path: str) -> list[Package]:
    text = view.read_text(path)
    if not text:
        return []
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:
        view.warn(f"{path}: not JSON")
        return []
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not isinstance(meta.get("version"), str):
        view.warn(f"{path}: no name/version")
        return []
    return [Package(name=meta["name"], version=meta["version"], kind="npm", source=meta["name"], location=path)]


def _accounts(view: ImageView, inv: Inventory) -> None:
    users = parse_passwd(view.read_text("/etc/passwd") or "")
    inv.users = [asdict(u) for u in users]
    inv.groups = [asdict(g) for g in parse_group(view.read_text("/etc/group") or "")]
    for path in ["/etc/sudoers", *(f"/etc/sudoers.d/{n}" for n in view.listdir("/etc/sudoers.d"))]:
        for line in (view.read_text(path) or "").splitlines():
            if (line.strip() and not line.lstrip().startswith("#")) or line.startswith(("#include", "@include")):
                inv.sudoers.append(f"{path}: {line.strip()}")
    for u in users:
        if not u.home.startswith("/") or u.home == "/":
            continue
        text = view.read_text(f"{u.home.rstrip('/')}/.ssh/authorized_keys")
        if text:
            keys = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            inv.authorized_keys[u.name] = len(keys)


def _sshd(view: ImageView) -> dict[str, str]:
    """Effective global sshd settings: includes expanded in place, first value wins."""
    settings: dict[str, str] = {}
    budget = [64]  # files read at most (include loops, hostile globs)

    def read(path: str) -> None:
        text = view.read_text(path)
        budget[0] -= 1
        if text is None or budget[0] < 0:
            return
        for key, value in parse_sshd_config(text):
            if key != "include":
                settings.setdefault(key, value)
                continue
            for pattern in value.split():
                full = pattern if pattern.startswith("/") else f"/etc/ssh/{pattern}"
                folder, _, glob = full.rpartition("/")
                for name in view.listdir(folder or "/"):
                    if fnmatch.fnmatch(name, glob):
                        read(f"{folder}/{name}")

    read("/etc/ssh/sshd_config")
    return settings


def _services(view: ImageView) -> list[str]:
    # Enabled units are the links under /etc/systemd/system/*.wants; vendor dirs only define units.
    base, out = "/etc/systemd/system", set[str]()
    for wants in (n for n in view.listdir(base) if n.endswith((".wants", ".requires"))):
        out.update(n for n in view.listdir(f"{base}/{wants}") if "." in n)
    return sorted(out)


def _cron(view: ImageView) -> list[str]:
    jobs = [f"/etc/crontab: {j}" for j in parse_cron(view.read_text("/etc/crontab") or "", system=True)]
    for name in view.listdir("/etc/cron.d"):
        text = view.read_text(f"/etc/cron.d/{name}") or ""
        jobs += [f"/etc/cron.d/{name}: {j}" for j in parse_cron(text, system=True)]
    for spool in ("/var/spool/cron/crontabs", "/var/spool/cron"):
        for name in view.listdir(spool):
            text = view.read_text(f"{spool}/{name}") or ""
            jobs += [f"{spool}/{name}: {j}" for j in parse_cron(text, system=False)]
    for period in ("hourly", "daily", "weekly", "monthly"):
        jobs += [f"/etc/cron.{period}/{n}" for n in view.listdir(f"/etc/cron.{period}") if n != ".placeholder"]
    return jobs


def _risky_files(view: ImageView, inv: Inventory) -> None:
    for e in view.walk("/"):
        if stat.S_ISLNK(e.mode):
            continue
        inv.file_modes[e.path] = (stat.S_IMODE(e.mode), e.uid, e.gid)
        if stat.S_ISREG(e.mode) and e.mode & (stat.S_ISUID | stat.S_ISGID):
            inv.setuid.append(e.path)
        if e.mode & stat.S_IWOTH:
            sticky_dir = stat.S_ISDIR(e.mode) and e.mode & stat.S_ISVTX
            if not sticky_dir and not e.path.startswith(_TEMP_DIRS):
                inv.world_writable.append(e.path)
