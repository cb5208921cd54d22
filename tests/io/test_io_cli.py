"""``carina io`` commands, run through the root CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from carina.cli.app import app

runner = CliRunner()


def _json(args: list[str]) -> object:
    result = runner.invoke(app, ["io", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_probe_names_the_choice_and_the_reasons(tmp_path: Path) -> None:
    report = _json(["probe", str(tmp_path)])
    assert isinstance(report, dict)
    assert report["backend"] in ("uring", "posix")
    assert report["order"] == ["uring", "posix"]
    assert report["io_uring"]["works"] == (report["backend"] == "uring")
    assert report["path"]["path"] == str(tmp_path)
    gathers = report["gather_path"]
    assert gathers["path"] == ("gpu" if gathers["device"] == "cuda" and not gathers["skipped"] else "host")
    assert gathers["why"]


def test_write_then_read_checks_the_pattern(tmp_path: Path) -> None:
    path = tmp_path / "p.bin"
    wrote = _json(["write", str(path), "--size", "1M", "--seed", "5"])
    assert isinstance(wrote, dict) and wrote["bytes"] == 1 << 20
    good = _json(["read", str(path), "--offset", "4K", "--length", "64K", "--verify-seed", "5"])
    assert isinstance(good, dict) and good["pattern_ok"] is True and good["bytes"] == 64 << 10
    bad = runner.invoke(app, ["io", "read", str(path), "--verify-seed", "6", "--json"])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["pattern_ok"] is False


def test_bench_reports_every_case_and_checks_reads(tmp_path: Path) -> None:
    rows = _json(
        [
            "bench",
            str(tmp_path / "b.bin"),
            "--size",
            "2M",
            "--blocks",
            "4K,64K",
            "--depths",
            "1,8",
            "--seconds",
            "0.05",
            "--access",
            "rand",
        ]
    )
    assert isinstance(rows, list) and len(rows) == 8
    reads = [r for r in rows if r["kind"] == "read"]
    assert reads and all(r["verified_bytes"] == r["bytes"] > 0 for r in reads)
    assert not (tmp_path / "b.bin").exists()


def test_a_bad_size_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["io", "write", str(tmp_path / "x"), "--size", "12Q"])
    assert result.exit_code == 2
    assert "not a size" in result.output


def test_importing_the_engine_does_not_import_torch() -> None:
    code = "import sys, carina.io; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
