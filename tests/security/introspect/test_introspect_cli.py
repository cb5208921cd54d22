"""`carina introspect` end to end: db import, scan with exit codes, inventory, CycloneDX SBOM."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from carina.security.introspect.cli import app

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "adv.json"
    res = runner.invoke(
        app, ["db", "import", str(FIXTURES / "osv"), str(FIXTURES / "tracker.json"), "--db", str(db), "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["advisories"] == 25  # 16 OSV - 1 withdrawn + 10 tracker (fixed_version 0 dropped)
    return db


def test_scan_json_and_exit_codes(debian_images: dict[str, Path], tmp_path: Path) -> None:
    db = _db(tmp_path)
    images = [str(debian_images["qcow2"]), str(debian_images["vmdk"])]
    res = runner.invoke(app, ["scan", *images, "--db", str(db), "--json", "--workers", "2", "--fail-on", "critical"])
    assert res.exit_code == 1, res.output  # DSA-0004-1 (zlib) is critical
    out = json.loads(res.stdout)
    assert [r["image"] for r in out["reports"]] == images
    assert all(len(r["findings"]) == 22 for r in out["reports"])
    res = runner.invoke(app, ["scan", images[0], "--db", str(tmp_path / "none.json"), "--json", "--rules", "none"])
    assert res.exit_code == 0 and json.loads(res.stdout)["reports"][0]["findings"] == []


def test_scan_of_missing_image_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["scan", str(tmp_path / "missing.qcow2"), "--db", str(tmp_path / "x.json")])
    assert res.exit_code == 2
    assert "image not found" in res.stdout


def test_table_output(debian_images: dict[str, Path], tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        ["scan", str(debian_images["lvm"]), "--db", str(_db(tmp_path)), "--fail-on", "unknown"],
        env={"COLUMNS": "250"},
    )
    assert res.exit_code == 1
    assert "DSA-0001-1" in res.stdout and "Debian GNU/Linux 12" in res.stdout


def test_sbom_is_valid_cyclonedx(debian_images: dict[str, Path], tmp_path: Path) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    out = tmp_path / "sbom.json"
    res = runner.invoke(app, ["sbom", str(debian_images["gpt"]), "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    purls = {c["purl"] for c in doc["components"]}
    assert "pkg:deb/debian/openssh-server@1:9.2p1-2%2Bdeb12u2?arch=amd64&distro=debian-12&upstream=openssh" in purls
    assert "pkg:npm/%40scope/tool@1.2.3" in purls and "pkg:pypi/requests@2.28.1" in purls
    assert len(purls) == 19  # 17 installed debs (the config-files remnant is left out) + pip + npm
    assert doc["metadata"]["component"]["type"] == "operating-system"


def test_inventory_json(debian_images: dict[str, Path]) -> None:
    res = runner.invoke(app, ["inventory", str(debian_images["xfs"]), "--json"])
    assert res.exit_code == 0
    inv = json.loads(res.stdout)["inventory"]
    assert inv["family"] == "debian" and inv["sshd"]["permitrootlogin"] == "prohibit-password"


def test_cli_modules_import_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, carina.security.introspect.cli, carina.security.faults.cli, carina.security.introspect.scan\n"
        "heavy = {'torch', 'dissect', 'h5py', 'matplotlib', 'cyclonedx'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_oval_export(debian_images: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "defs.xml"
    res = runner.invoke(app, ["oval", str(debian_images["qcow2"]), "--db", str(_db(tmp_path)), "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.count('class="vulnerability"') == 24  # advisory x binary pairs for Debian 12 sources on the image
    assert "<linux-def:name>openssh-server</linux-def:name>" in text and "DSA-0005-1" not in text  # Debian 11 left out
