"""carina.offload (disagg included) imports only lower floors: never carina.cli, carina.ckpt or carina.gnn."""

from __future__ import annotations

import ast
from pathlib import Path

import carina.offload

FORBIDDEN = ("carina.cli", "carina.ckpt", "carina.gnn", "carina.infra", "carina.security")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_offload_never_imports_upward_or_sideways():
    root = Path(carina.offload.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert any(f.name == "train_cli.py" for f in files) and any(f.parent.name == "disagg" for f in files)
    bad = [
        f"{f.relative_to(root)}: {name}"
        for f in files
        for name in _imports(f)  # lazy imports inside functions included
        if name.startswith(FORBIDDEN)
    ]
    assert bad == []


def test_the_scan_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from carina.cli.train_disagg import run_disagg\n")
    assert _imports(probe) == ["carina.cli.train_disagg"]
