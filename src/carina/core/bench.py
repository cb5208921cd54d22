"""The one JSON record every carina benchmark writes, and its markdown rendering.

A record says what ran (command, config, git SHA, machine, environment from
``carina doctor``), what came out (figures and free-form metrics), and how each
figure compares with its physical ceiling and with the peers measured in the
same run::

    fig = Figure(name="read_bw", value=1.31, unit="GB/s", ceiling=1.52,
                 ceiling_source="fio seq read, same disk", peers={"torch.load": 0.62})
    rec = make_record(name="io_seq_read", figures=[fig], config=cfg)
    write_record(rec)                      # benchmarks/results/<machine>/io_seq_read.json
    print(render_markdown(load_records("benchmarks/results")))

Figures that were not measured on real hardware say so in ``basis``
(``emulated``, ``simulated`` or ``modeled``); tables show it.
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core import flags
from carina.core.errors import ConfigError, ModelFormatError
from carina.core.progress import to_jsonable

__all__ = [
    "SCHEMA",
    "Basis",
    "Figure",
    "git_state",
    "load_records",
    "machine_label",
    "make_record",
    "render_markdown",
    "results_dir",
    "scrub_paths",
    "validate_record",
    "write_record",
]

SCHEMA = "carina.bench/1"
_REPO = Path(__file__).resolve().parents[3]


class Basis(enum.Enum):
    """How a figure was obtained."""

    MEASURED = "measured"
    EMULATED = "emulated"  # real code, emulated hardware (e.g. a fake CC-mode GPU)
    SIMULATED = "simulated"  # a simulator stands in for the system
    MODELED = "modeled"  # an analytical model's prediction
    DERIVED = "derived"  # computed from other committed records, no new measurement


@dataclass(kw_only=True)
class Figure:
    """One number a benchmark reports.

    Attributes:
        name: Stable identifier (``read_bw``, ``tokens_per_s``).
        value: The figure.
        unit: Its unit (``GB/s``, ``tokens/s``, ``s``).
        higher_is_better: Direction used for ratios.
        ceiling: The physical limit for this figure on this machine, if known.
        ceiling_source: Where the ceiling comes from (a measurement, a spec sheet).
        peers: Peer system name to its value, measured in the same run.
        basis: Measured, emulated, simulated, modeled or derived (from other records).
    """

    name: str
    value: float
    unit: str
    higher_is_better: bool = True
    ceiling: float | None = None
    ceiling_source: str = ""
    peers: dict[str, float] = field(default_factory=dict)
    basis: Basis = Basis.MEASURED

    def ratio_to_ceiling(self) -> float | None:
        """Fraction of the ceiling reached (1.0 = at the physical limit)."""
        if self.ceiling is None or self.ceiling == 0 or self.value == 0:
            return None
        r = self.value / self.ceiling
        return r if self.higher_is_better else 1.0 / r

    def ratio_to_peers(self) -> dict[str, float | None]:
        """Per peer, how many times better carina is (> 1 means carina wins)."""
        out: dict[str, float | None] = {}
        for peer, pv in self.peers.items():
            if pv == 0 or self.value == 0:
                out[peer] = None
            else:
                out[peer] = self.value / pv if self.higher_is_better else pv / self.value
        return out

    def to_dict(self) -> dict[str, Any]:
        """The figure as it appears in a record."""
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "basis": self.basis.value,
            "ceiling": self.ceiling,
            "ceiling_source": self.ceiling_source,
            "ratio_to_ceiling": self.ratio_to_ceiling(),
            "peers": {p: {"value": v, "ratio": self.ratio_to_peers()[p]} for p, v in self.peers.items()},
        }


def git_state(repo: Path = _REPO) -> tuple[str, bool]:
    """``(sha, dirty)`` of the checkout carina runs from, ``("unknown", False)`` outside git."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return sha, dirty


def machine_label(environment: Mapping[str, Any]) -> str:
    """Short label of the machine, used as the results folder (``h100``, ``cpu``)."""
    gpus = environment.get("torch", {}).get("gpus") or []
    if not gpus:
        return "cpu"
    name = str(gpus[0].get("name", "gpu")).lower()
    for tag in ("h200", "h100", "a100", "l40s", "l4", "a10", "4090", "3090"):
        if tag in name:
            return tag
    return "gpu"


def make_record(
    *,
    name: str,
    figures: Sequence[Figure],
    config: Any,
    command: str | Sequence[str] | None = None,
    metrics: Mapping[str, Any] | None = None,
    notes: str = "",
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a record; ``config`` is a carina Config or a plain dict.

    ``environment`` defaults to ``carina doctor``'s report of this machine and
    ``command`` to the command line of this process.
    """
    if not name or "/" in name:
        raise ConfigError("record name must be a non-empty file-safe string", key="name")
    if environment is None:
        from carina.core.doctor import collect

        environment = to_jsonable(collect(paths=()))
    if command is None:
        command = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    cmd = command if isinstance(command, str) else shlex.join(command)
    sha, dirty = git_state()
    seen = {}
    if flags.SOURCE_COMMIT.get():  # a copied tree (device machine): its .git is not the commit it holds
        seen = {"git_sha_seen": sha, "git_dirty_seen": dirty}
        sha, dirty = flags.SOURCE_COMMIT.get(), False
    cfg = config.to_dict() if hasattr(config, "to_dict") else to_jsonable(config)
    env: dict[str, Any] = scrub_paths(dict(environment))
    cmd, cfg = scrub_paths(cmd), scrub_paths(cfg)
    if isinstance(env.get("python"), dict) and "executable" in env["python"]:
        # The interpreter's location names the machine; its version is what matters.
        env["python"] = {**env["python"], "executable": Path(env["python"]["executable"]).name}
    return {
        "schema": SCHEMA,
        "name": name,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_sha": sha,
        "git_dirty": dirty,
        **seen,
        "machine": {"label": machine_label(env), "hostname": platform.node()},
        "command": cmd,
        "config": cfg,
        "environment": env,
        "figures": [f.to_dict() for f in figures],
        "metrics": to_jsonable(dict(metrics or {})),
        "notes": notes,
    }


def scrub_paths(obj: Any) -> Any:
    """Replace this checkout's absolute path by ``$REPO`` (records must not name the machine's paths)."""
    root = str(_REPO)
    if isinstance(obj, str):
        return obj.replace(root, "$REPO")
    if isinstance(obj, Mapping):
        return {k: scrub_paths(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub_paths(v) for v in obj]
    return obj


def results_dir(label: str) -> Path:
    """Where records of machine ``label`` go (``CARINA_RESULTS_DIR`` overrides)."""
    override = flags.RESULTS_DIR.get()
    return Path(override) if override else _REPO / "benchmarks" / "results" / label


def write_record(record: Mapping[str, Any], *, directory: Path | None = None) -> Path:
    """Validate and write ``record`` as ``<directory>/<name>.json``; return the path."""
    validate_record(record)
    out = directory or results_dir(record["machine"]["label"])
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['name']}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


_REQUIRED = ("schema", "name", "git_sha", "machine", "command", "config", "environment", "figures")
_FIGURE_KEYS = ("name", "value", "unit", "basis", "ceiling", "ratio_to_ceiling", "peers")


def validate_record(record: Mapping[str, Any], *, source: str = "<record>") -> None:
    """Check a record's shape.

    Raises:
        ModelFormatError: A key is missing or the schema is unknown.
    """
    for key in _REQUIRED:
        if key not in record:
            raise ModelFormatError(f"record lacks {key!r}", file=source)
    if record["schema"] != SCHEMA:
        raise ModelFormatError(f"unknown schema {record['schema']!r}", file=source)
    for i, fig in enumerate(record["figures"]):
        missing = [k for k in _FIGURE_KEYS if k not in fig]
        if missing:
            raise ModelFormatError(f"figure {i} lacks {missing[0]!r}", file=source)
        if fig["basis"] not in {b.value for b in Basis}:
            raise ModelFormatError(f"figure {i} has unknown basis {fig['basis']!r}", file=source)


def load_records(paths: Path | str | Iterable[Path | str]) -> list[dict[str, Any]]:
    """Read records from files or folders (recursively), validating each."""
    if isinstance(paths, str | Path):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.rglob("*.json")) if p.is_dir() else [p])
    records = []
    for f in files:
        try:
            rec = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"not JSON: {exc.msg}", file=str(f), line=exc.lineno) from exc
        validate_record(rec, source=str(f))
        records.append(rec)
    return records


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}g}"


def render_markdown(records: Sequence[Mapping[str, Any]], *, title: str | None = None) -> str:
    """A markdown table with one row per figure of every record."""
    head = "| record | machine | figure | value | basis | vs ceiling | vs peers |\n|---|---|---|---|---|---|---|"
    rows = []
    for rec in records:
        for fig in rec["figures"]:
            ceil = fig["ratio_to_ceiling"]
            ceil_txt = "–" if ceil is None else f"{ceil:.0%} of {_fmt(fig['ceiling'])} {fig['unit']}"
            peers = ", ".join(f"{p} {_fmt(v['value'])} ({_fmt(v['ratio'])}x)" for p, v in fig["peers"].items())
            rows.append(
                f"| {rec['name']} | {rec['machine']['label']} | {fig['name']} | "
                f"{_fmt(fig['value'], 4)} {fig['unit']} | {fig['basis']} | {ceil_txt} | {peers or '–'} |"
            )
    body = "\n".join([head, *rows])
    return f"### {title}\n\n{body}\n" if title else body + "\n"
