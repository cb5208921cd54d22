"""fstab-driven assembly: a root, /usr, and LVM /var and /home scanned as one tree; the fstab parser vs findmnt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from introspect_images import dpkg_query, sha256

from carina.security.introspect.image import open_image
from carina.security.introspect.mounts import FsIdentity, FstabEntry, match_device, parse_fstab, wanted
from carina.security.introspect.scan import ScanConfig, scan_image
from carina.testing.introspect import FakeDebian, write_tree
from carina.testing.introspect_split import USR_UUID, build_split_image, fstab_text


def _tree(path: Path) -> Path:
    root = write_tree(path, FakeDebian(world_writable=("var/lib/app/shared.txt",)))
    keys = root / "home/alice/.ssh/authorized_keys"
    keys.parent.mkdir(parents=True)
    keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlice alice@laptop\nssh-rsa AAAAB3Nza alice@old\n")
    return root


def _patched(raw: Path, out: Path, edits: list[tuple[bytes, bytes]]) -> Path:
    """A copy of ``raw`` with same-length byte edits in the root partition's fstab (file data has no checksum)."""
    subprocess.run(["cp", "--sparse=always", str(raw), str(out)], check=True)
    with out.open("r+b") as fh:
        head = fh.read(64 << 20)  # partition 1 (root) lies in the first MiBs
        for old, new in edits:
            assert len(old) == len(new) and head.count(old) == 1
            fh.seek(head.index(old))
            fh.write(new)
    return out


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("split")
    root = _tree(work / "root")
    raw = build_split_image(root, work / "split.raw", fmt="raw")
    image = work / "split.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(image)], check=True)
    usr = f"UUID={USR_UUID.upper()}".encode()
    broken = _patched(
        raw,
        work / "broken.raw",
        [(usr, b"UUID=00000000-0000-0000-0000-000000000000"), (b"/dev/mapper/vg0-var", b"/dev/sda9          ")],
    )
    return {"root": root, "image": image, "broken": broken}


def _tree_paths(root: Path) -> set[str]:
    out = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add("/" + os.path.relpath(os.path.join(folder, name), root))
    return out


@pytest.mark.slow
def test_split_image_scans_as_one_tree_and_is_unchanged(split: dict[str, Path]) -> None:
    before = sha256(split["image"])
    report = scan_image(split["image"], ScanConfig())
    assert report.error == "" and not report.partial, report.warnings
    assert report.volumes == ["ext", "ext", "xfs", "ext"]
    inv = report.inventory
    assert inv is not None
    # dpkg status lives on the XFS /var logical volume; the oracle reads the unsplit tree.
    assert {(p.name, p.version, p.arch) for p in inv.packages if p.kind == "deb"} == dpkg_query(split["root"])
    assert inv.setuid == ["/usr/bin/passwd"]  # on the /usr partition
    assert "/var/lib/app/shared.txt" in inv.world_writable  # on /var
    assert inv.authorized_keys == {"root": 1, "alice": 2}  # alice's on the /home LV
    assert inv.services == ["ssh.service"]  # unit under /lib -> usr/lib, across the mount
    assert inv.kernels == ["6.1.0-18-amd64"]  # /boot on root, /lib/modules on /usr
    assert [p.name for p in inv.packages if p.kind == "pypi"] == ["requests"]
    view = open_image(split["image"])
    assert sorted(view.mounts) == ["/home", "/usr", "/var"]
    walked = {e.path for e in view.walk("/")}
    assert {p for p in walked if "lost+found" not in p} == _tree_paths(split["root"])
    assert sha256(split["image"]) == before


@pytest.mark.slow
def test_unmatched_fstab_entries_make_the_scan_partial(split: dict[str, Path]) -> None:
    report = scan_image(split["broken"], ScanConfig())
    assert report.partial and report.error == ""
    assert report.inventory is not None
    assert [p for p in report.inventory.packages if p.kind == "deb"] == []  # /var not mounted
    assert report.inventory.authorized_keys == {"root": 1, "alice": 2}  # /home still found
    assert report.warnings == [
        "/etc/fstab line 4: UUID=00000000-0000-0000-0000-000000000000 for /usr not found in the image; "
        "its files are not read",
        "/etc/fstab line 5: /dev/sda9 for /var not found in the image; its files are not read",
    ]


@pytest.mark.parametrize(
    ("spec", "ident", "expected"),
    [
        ("UUID=ABCD-1234", FsIdentity(uuid="abcd-1234"), True),
        ('UUID="abcd-1234"', FsIdentity(uuid="abcd-1234"), True),
        ("LABEL=Root", FsIdentity(label="root"), False),
        ("LABEL=root", FsIdentity(label="root"), True),
        ("/dev/disk/by-label/root", FsIdentity(label="root"), True),
        ("/dev/disk/by-partuuid/AA-BB", FsIdentity(partuuid="aa-bb"), True),
        ("PARTLABEL=usr", FsIdentity(partlabel="usr", partno=2), True),
        ("/dev/sda2", FsIdentity(partno=2), True),
        ("/dev/nvme0n1p2", FsIdentity(partno=2), True),
        ("/dev/nvme0n1p2", FsIdentity(partno=3), False),
        ("/dev/sda2", FsIdentity(lv=("vg0", "var")), False),
        ("/dev/mapper/vg0-var", FsIdentity(lv=("vg0", "var")), True),
        ("/dev/mapper/my--vg-my--lv", FsIdentity(lv=("my-vg", "my-lv")), True),
        ("/dev/mapper/my-vg-my-lv", FsIdentity(lv=("my-vg", "my-lv")), False),
        ("/dev/vg0/var", FsIdentity(lv=("vg0", "var")), True),
        ("/dev/vg0/var", FsIdentity(partno=1), False),
        ("UUID=", FsIdentity(), False),
        ("server:/export", FsIdentity(uuid="x"), False),
    ],
)
def test_match_device(spec: str, ident: FsIdentity, expected: bool) -> None:
    assert match_device(spec, ident) is expected


def test_wanted_skips_what_is_not_a_disk_filesystem() -> None:
    entries, errors = parse_fstab(
        fstab_text() + "/srv /srv2 none bind 0 0\nUUID=x data ext4\n/dev/sdb1 //a/./b/../c auto\n"
    )
    assert errors == []
    assert [wanted(e) for e in entries] == [None, "/usr", "/var", "/home", None, None, None, None, None, "/a/c"]


_CHARS = st.text(alphabet="abcXYZ019/=-_.,:#\\ \t", min_size=1, max_size=12)
_ENTRY = st.tuples(
    _CHARS.filter(lambda s: not s.lstrip(" \t").startswith("#")),
    _CHARS,
    _CHARS,
    st.one_of(st.none(), _CHARS),
    st.one_of(st.none(), st.integers(-9, 99)),
    st.one_of(st.none(), st.integers(-9, 99)),
)


def _escape(field: str) -> str:
    return field.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


def _line(entry: tuple, sep: str) -> str:
    spec, file, vfstype, options, freq, passno = entry
    fields = [_escape(spec), _escape(file), _escape(vfstype)]
    if options is not None:
        fields.append(_escape(options))
        if freq is not None:
            fields.append(str(freq))
            if passno is not None:
                fields.append(str(passno))
    return sep.join(fields)


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="findmnt (util-linux) not installed")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(_ENTRY, max_size=6),
    seps=st.lists(st.sampled_from([" ", "\t", "  \t "]), min_size=6, max_size=6),
    noise=st.lists(st.sampled_from(["", "# comment", "   # indented", "bad", "a b c d x"]), max_size=3),
)
def test_fstab_parser_agrees_with_libmount(tmp_path: Path, entries: list, seps: list[str], noise: list[str]) -> None:
    lines = [_line(e, seps[i % len(seps)]) for i, e in enumerate(entries)] + noise
    text = "\n".join(lines) + "\n"
    path = tmp_path / "fstab"
    path.write_text(text)
    out = subprocess.run(
        ["findmnt", "--fstab", "--tab-file", str(path), "-J", "-o", "SOURCE,TARGET,FSTYPE,OPTIONS,FREQ,PASSNO"],
        capture_output=True,
        text=True,
    ).stdout
    theirs = [
        (f["source"], f["target"], f["fstype"], f["options"] or "", f["freq"], f["passno"])
        for f in (json.loads(out)["filesystems"] if out.strip() else [])
    ]
    parsed, errors = parse_fstab(text)
    ours = [(e.spec, e.file, e.vfstype, ",".join(e.options), e.freq, e.passno) for e in parsed]
    assert ours == theirs
    assert len(errors) == sum(n in ("bad", "a b c d x") for n in noise)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_fstab_parser_never_raises_and_mount_points_stay_absolute(text: str) -> None:
    entries, errors = parse_fstab(text)
    assert all(isinstance(m, str) for m in errors)
    assert all(isinstance(e, FstabEntry) and e.line >= 1 for e in entries)
    for e in entries:
        mount = wanted(e)
        assert mount is None or (mount.startswith("/") and mount != "/" and ".." not in mount.split("/"))
