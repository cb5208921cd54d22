"""Planted package set, dpkg-query oracle and hashing for the introspection tests."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from carina.testing.introspect import BASE_PACKAGES, DebPkg

FORMATS = ("ext4", "xfs", "gpt", "lvm", "qcow2", "vmdk", "qcow2-chain")

PLANTED = [
    *[p for p in BASE_PACKAGES if p.name not in {"openssh-server", "openssh-client"}],
    DebPkg(name="openssh-server", version="1:9.2p1-2+deb12u2", source="openssh"),
    DebPkg(name="openssh-client", version="1:9.2p1-2+deb12u2", source="openssh"),
    DebPkg(name="zlib1g", version="1:1.2.13.dfsg-1", source="zlib"),
    DebPkg(name="tar", version="1.34+dfsg-1.2+deb12u1"),
    DebPkg(name="curl", version="7.88.1-10+deb12u5"),
    DebPkg(name="libcurl4", version="7.88.1-10+deb12u5", source="curl"),
    DebPkg(name="libexpat1", version="2.5.0-1", source="expat"),
    DebPkg(name="systemd", version="252.22-1~deb12u1"),
    DebPkg(name="libsystemd0", version="252.22-1~deb12u1", source="systemd"),
    DebPkg(name="perl-base", version="5.36.0-7+deb12u1", source="perl"),
    DebPkg(name="gzip", version="1.12-1"),
    DebPkg(name="epochpkg", version="1:2.0-1"),
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dpkg_query(root: Path) -> set[tuple[str, str, str]]:
    out = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Package}\t${Version}\t${Architecture}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {tuple(line.split("\t")) for line in out.splitlines()}  # type: ignore[misc]
