from __future__ import annotations

import hashlib
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carina.core.errors import ProvisioningError
from carina.infra.provision.imagefile import (
    QCOW2_MAGIC,
    copy_checksummed,
    inspect_image,
    parse_qcow2_header,
)


def qcow2_header(
    *, version: int = 3, backing: int = 0, cbits: int = 16, size: int = 1 << 20, crypt: int = 0, incompat: int = 0
) -> bytes:
    head = QCOW2_MAGIC + struct.pack(">IQIIQI", version, backing, 0, cbits, size, crypt)
    head = head.ljust(72, b"\0") + struct.pack(">Q", incompat)
    return head.ljust(112, b"\0")


def test_valid_header_parses() -> None:
    h = parse_qcow2_header(qcow2_header())
    assert (h.version, h.cluster_bits, h.size) == (3, 16, 1 << 20)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"backing": 512}, "backing file"),
        ({"crypt": 1}, "encrypted"),
        ({"incompat": 2}, "marked corrupt"),
        ({"incompat": 4}, "external data file"),
        ({"cbits": 30}, "cluster_bits"),
        ({"size": 0}, "virtual size"),
        ({"version": 7}, "version"),
    ],
)
def test_refused_headers(kwargs: dict[str, int], why: str) -> None:
    with pytest.raises(ProvisioningError, match=why):
        parse_qcow2_header(qcow2_header(**kwargs), source="x.qcow2")


@given(st.binary(max_size=200))
def test_header_parser_never_crashes(data: bytes) -> None:
    try:
        head = parse_qcow2_header(data)
    except ProvisioningError:
        return
    assert data.startswith(QCOW2_MAGIC) and head.backing_file_offset == 0 and head.size > 0


@given(
    version=st.sampled_from([2, 3]),
    cbits=st.integers(0, 40),
    backing=st.integers(0, 2**64 - 1),
    size=st.integers(0, 2**64 - 1),
    incompat=st.integers(0, 2**64 - 1),
)
def test_header_fields_round_trip_or_refuse(version: int, cbits: int, backing: int, size: int, incompat: int) -> None:
    data = qcow2_header(version=version, cbits=cbits, backing=backing, size=size, incompat=incompat)
    try:
        head = parse_qcow2_header(data)
    except ProvisioningError:
        assert backing or size == 0 or not 9 <= cbits <= 21 or (version == 3 and incompat & 6)
        return
    assert (head.cluster_bits, head.size, head.backing_file_offset) == (cbits, size, 0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tail=st.binary(min_size=0, max_size=600))
def test_garbage_qcow2_files_are_refused(tmp_path: Path, tail: bytes) -> None:
    bad = tmp_path / "bad.qcow2"
    bad.write_bytes(qcow2_header()[:104] + tail)
    with pytest.raises(ProvisioningError):
        inspect_image(bad)


def test_inspect_raw_and_qcow2(tmp_path: Path, golden: Path) -> None:
    raw = inspect_image(golden)
    assert (raw.format, raw.virtual_size) == ("raw", golden.stat().st_size)
    q = tmp_path / "g.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(golden), str(q)], check=True)
    facts = inspect_image(q)
    assert (facts.format, facts.virtual_size) == ("qcow2", golden.stat().st_size)
    with pytest.raises(ProvisioningError, match="not raw"):
        inspect_image(q, "raw")


def test_inspect_refuses_overlay_vmdk_and_odd_sizes(tmp_path: Path, golden: Path) -> None:
    overlay = tmp_path / "o.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(golden), "-F", "raw", str(overlay)], check=True
    )
    with pytest.raises(ProvisioningError, match="backing file"):
        inspect_image(overlay)
    vmdk = tmp_path / "x.vmdk"
    vmdk.write_bytes(b"KDMV" + bytes(1020))
    with pytest.raises(ProvisioningError, match="vmdk"):
        inspect_image(vmdk)
    odd = tmp_path / "odd.raw"
    odd.write_bytes(b"x" * 1000)
    with pytest.raises(ProvisioningError, match="multiple of 512"):
        inspect_image(odd)
    with pytest.raises(ProvisioningError, match="not found"):
        inspect_image(tmp_path / "missing.raw")


def test_copy_is_checksummed_and_atomic(tmp_path: Path) -> None:
    src = tmp_path / "src.raw"
    data = b"\1" * 4096 + bytes(8 << 20) + b"\2" * 512
    src.write_bytes(data)
    dest = tmp_path / "out" / "img.raw"
    digest = copy_checksummed(src, dest)
    assert digest == hashlib.sha256(data).hexdigest() and dest.read_bytes() == data
    assert dest.stat().st_blocks * 512 < len(data)  # the zero run stayed a hole
    other = tmp_path / "out" / "img2.raw"
    with pytest.raises(ProvisioningError, match="checksum mismatch"):
        copy_checksummed(src, other, expect_sha256="0" * 64)
    assert sorted(p.name for p in other.parent.iterdir()) == ["img.raw"]
