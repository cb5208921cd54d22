import json
import subprocess
import sys

from typer.testing import CliRunner

from carina.cli.app import app
from carina.cli.lazy import SUBCOMMANDS

ROOT_COMMANDS = [
    "version",
    "doctor",
    "io",
    "train",
    "offload",
    "gnn",
    "ckpt",
    "cluster",
    "provision",
    "storage",
    "risk",
    "introspect",
    "tee",
    "faults",
]

HEAVY = ("torch", "networkx", "fastapi", "dissect", "cupy", "pynvml", "transformers", "sqlalchemy")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_carina_is_lean():
    mods = _modules_after("import carina, carina.errors, carina.core.config, carina.core.bench")
    assert not {m for m in mods if m.split(".")[0] in HEAVY}


def test_help_is_lean():
    code = "import sys\nfrom carina.cli.app import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
    mods = _modules_after(code)
    assert not {m for m in mods if m.split(".")[0] in HEAVY}
    assert "torch.cuda" not in mods


def test_root_commands_snapshot():
    assert [s.name for s in SUBCOMMANDS] == ROOT_COMMANDS[2:]
    result = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    listed = [name for name in ROOT_COMMANDS if f" {name} " in result.output]
    present = ["version", "doctor"] + [s.name for s in SUBCOMMANDS if s.present()]
    assert listed == present


def test_version_json():
    result = CliRunner().invoke(app, ["version", "--json"])
    assert result.exit_code == 0
    from carina import __version__

    assert json.loads(result.output) == {"carina": __version__}


def test_every_present_subapp_loads_and_has_help():
    runner = CliRunner()
    for sub in SUBCOMMANDS:
        if sub.present():
            result = runner.invoke(app, [sub.name, "--help"])
            assert result.exit_code == 0, (sub.name, result.output)
