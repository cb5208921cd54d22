from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carina.infra.storage.cli import app
from carina.testing.storage import TierProcess, qemu_io


def test_serve_publishes_stats_and_stats_reads_them(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TierProcess(["--store", str(store), "--size", "8M", "--block-size", "4K", "--engine", "inline",
                      "--stats-interval", "0.1"]) as tier:  # fmt: skip
        qemu_io(tier.url, "write -P 0x61 0 1M", "read -P 0x61 0 1M")
        tier.stop()
    assert [e["event"] for e in tier.events][:2] == ["ready", "stats"] and tier.events[-1]["event"] == "stopped"
    assert tier.events[-1]["ops"] == {"write": 1, "read": 1, "flush": 1} and tier.events[-1]["ratio"] > 50
    result = CliRunner().invoke(app, ["stats", "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["mapped_blocks"] == 256 and data["logical_bytes"] == 1 << 20
    assert data["ratio"] > 50  # 1 MiB of one byte value compresses enormously
    assert data["live"]["ops"]["write"] == 1 and data["live"]["bytes_read"] == 1 << 20


def test_stats_on_missing_store_fails_cleanly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["stats", "--store", str(tmp_path / "none")])
    assert result.exit_code == 1 and "no carina store" in result.output


def test_serve_rejects_bad_config(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path), "--block-size", "3000"])
    assert result.exit_code != 0 and "block_size" in result.output


@pytest.mark.parametrize(
    ("option", "value", "choices"),
    [("--engine", "bogus", "inline, thread, process, torch, nvcomp"), ("--cuda-wait", "nope", "spin, block")],
)
def test_serve_names_the_option_and_its_choices_for_a_bad_value(
    tmp_path: Path, option: str, value: str, choices: str
) -> None:
    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path / "s"), "--port", "0", option, value])
    assert result.exit_code != 0
    text = " ".join(str(result.output).replace("│", " ").split())  # the message, unwrapped from its box
    assert f"{option} must be one of {choices}, not '{value}'" in text
    assert not (tmp_path / "s").exists()  # nothing was created
