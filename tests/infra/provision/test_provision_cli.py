from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from carina.infra.provision.cli import app
from carina.infra.provision.config import ProvisionConfig


def test_cli_round_trip(config: ProvisionConfig, golden: Path, tmp_path: Path) -> None:
    cfg = config.save(tmp_path / "provision.toml")
    runner = CliRunner()

    def run(*args: str) -> object:
        result = runner.invoke(app, [*args, "--config", str(cfg)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout) if "--json" in args else result.stdout

    try:
        image = run("image", "import", "gold", str(golden), "--json")
        assert isinstance(image, dict) and image["format"] == "raw"
        assert [i["name"] for i in run("image", "ls", "--json")] == ["gold"]  # type: ignore[union-attr]
        run("node", "add", "n1", "--mac", "52:54:00:bb:00:01", "--json")
        placed = run("node", "provision", "n1", "gold", "--json")
        assert isinstance(placed, dict) and placed["uri"].startswith("nbd://")
        nodes = run("node", "ls", "--json")
        assert isinstance(nodes, list) and nodes[0]["state"] == "provisioned"
        bad = runner.invoke(app, ["image", "rm", "gold", "--config", str(cfg)])
        assert bad.exit_code == 1 and "n1" in bad.output
        token = run("project", "token", "default", "--json")
        assert isinstance(token, dict) and len(token["token"]) > 20
        run("node", "release", "n1", "--json")
        run("image", "rm", "gold")
        assert run("image", "ls", "--json") == []
        missing = runner.invoke(app, ["node", "provision", "nx", "gold", "--config", str(cfg)])
        assert missing.exit_code == 1 and "no node 'nx'" in missing.output
    finally:
        runner.invoke(app, ["down", "--config", str(cfg)])
    assert not (config.state_dir / "run" / "qemu-storage-daemon.pid").exists()


def test_unknown_export_kind_is_refused_before_touching_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    res = CliRunner().invoke(app, ["node", "provision", "n1", "img", "--export", "floppy", "--state", str(state)])
    assert res.exit_code == 1
    assert "floppy" in res.output and "export" in res.output
    assert not state.exists()


def test_listing_a_missing_state_is_an_error_not_an_empty_service(tmp_path: Path) -> None:
    state = tmp_path / "typo"
    for args in (["image", "ls"], ["node", "ls"], ["reconcile"], ["down"]):
        res = CliRunner().invoke(app, [*args, "--state", str(state)])
        assert res.exit_code == 1, args
        assert "no provisioning state" in res.output and "typo" in res.output
    assert not state.exists()
