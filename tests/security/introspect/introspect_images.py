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


def rpm_header(name: str, epoch: int, version: str, release: str, *, arch: str = "x86_64", pad: int = 0) -> bytes:
    """An rpm header blob with NEVRA, a source rpm and ``pad`` bytes of description (to go off-page)."""
    import struct

    tags = {
        1000: (6, name.encode() + b"\0"),
        1001: (6, version.encode() + b"\0"),
        1002: (6, release.encode() + b"\0"),
        1005: (6, b"d" * pad + b"\0"),
        1022: (6, arch.encode() + b"\0"),
        1044: (6, f"{name}-{version}-{release}.src.rpm".encode() + b"\0"),
    }
    if epoch:
        tags[1003] = (4, struct.pack(">i", epoch))
    index, data = b"", b""
    for tag, (typ, payload) in sorted(tags.items()):
        if typ == 4:
            data += b"\0" * (-len(data) % 4)  # rpm rejects unaligned INT32 data
        index += struct.pack(">IIiI", tag, typ, len(data), 1)
        data += payload
    return struct.pack(">II", len(tags), len(data)) + index + data


def make_hash_db(path: Path, records: dict[bytes, bytes], *, pagesize: int = 4096) -> Path:
    """A Berkeley DB hash database written by libdb's own ``db5.3_load``."""
    lines = ["VERSION=3", "format=bytevalue", "type=hash", f"db_pagesize={pagesize}", "HEADER=END"]
    for key, value in records.items():
        lines += [" " + key.hex(), " " + value.hex()]
    lines.append("DATA=END")
    subprocess.run(["db5.3_load", str(path)], input="\n".join(lines) + "\n", text=True, check=True, capture_output=True)
    return path
