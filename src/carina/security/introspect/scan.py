"""Scan images: open read-only, inventory, match advisories, check compliance; many at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from carina.core import flags
from carina.core.config import Config, require
from carina.core.errors import CarinaError
from carina.security.introspect.advisories import Advisory, Severity, load_db
from carina.security.introspect.compliance import Rule, RuleResult, Status, evaluate, load_rules, starter_rules
from carina.security.introspect.image import open_image
from carina.security.introspect.inventory import Inventory, collect_inventory
from carina.security.introspect.vulns import Finding, match

__all__ = ["DEFAULT_DB", "ScanConfig", "ScanReport", "default_db_path", "exit_code", "scan_image", "scan_many"]

DEFAULT_DB = flags.define(
    "CARINA_INTROSPECT_DB",
    str,
    "",
    "advisory database of `carina introspect` (default ~/.cache/carina/advisories.json)",
)


def default_db_path() -> Path:
    """Where ``db import`` writes and ``scan`` reads unless told otherwise."""
    return Path(DEFAULT_DB.get()) if DEFAULT_DB.get() else Path.home() / ".cache" / "carina" / "advisories.json"


@dataclass(kw_only=True)
class ScanConfig(Config):
    """How images are scanned.

    Attributes:
        db: Advisory database from ``db import`` (empty: skip vulnerability matching).
        rules: YAML rule file (empty: the starter set; ``none``: skip compliance).
        workers: Images scanned in parallel (each in its own process; bounds memory).
        max_file_bytes: Largest file read from an image.
        max_entries: Most filesystem entries walked per image.
        fail_on: Severity at or above which a finding or failed rule sets a nonzero exit code.
    """

    db: str = ""
    rules: str = ""
    workers: int = 2
    max_file_bytes: int = 64 << 20
    max_entries: int = 500_000
    fail_on: str = "high"

    def validate(self) -> None:
        """Check ranges and the severity name."""
        require(self.workers >= 1, "workers must be >= 1", key="workers")
        require(self.max_file_bytes >= 4096, "max_file_bytes must be >= 4096", key="max_file_bytes")
        require(self.max_entries >= 1, "max_entries must be >= 1", key="max_entries")
        names = [s.name.lower() for s in Severity]
        require(self.fail_on.lower() in names, f"fail_on must be one of {names}", key="fail_on")


@dataclass(kw_only=True)
class ScanReport:
    """Everything one image's scan produced; ``partial`` when anything could not be read."""

    image: str
    volumes: list[str] = field(default_factory=list)
    inventory: Inventory | None = None
    findings: list[Finding] = field(default_factory=list)
    compliance: list[RuleResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    @property
    def partial(self) -> bool:
        """True when the scan failed or skipped something."""
        return bool(self.error or self.warnings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        return {
            "image": self.image,
            "partial": self.partial,
            "error": self.error,
            "volumes": self.volumes,
            "seconds": round(self.seconds, 4),
            "inventory": self.inventory.to_dict() if self.inventory else None,
            "findings": [asdict(f) for f in self.findings],
            "compliance": [{**asdict(r), "status": r.status.value} for r in self.compliance],
            "warnings": self.warnings,
        }


def _rules(cfg: ScanConfig) -> list[Rule]:
    if cfg.rules == "none":
        return []
    if not cfg.rules:
        return starter_rules()
    return load_rules(Path(cfg.rules).read_text(), file=cfg.rules)


def scan_image(
    path: str | Path, cfg: ScanConfig, *, advisories: Sequence[Advisory] = (), rules: Sequence[Rule] | None = None
) -> ScanReport:
    """Scan one image; never raises for a bad image (the report carries ``error``)."""
    t0 = time.perf_counter()
    report = ScanReport(image=str(path))
    try:
        view = open_image(path, max_file_bytes=cfg.max_file_bytes, max_entries=cfg.max_entries)
    except CarinaError as exc:
        report.error = str(exc)
        report.seconds = time.perf_counter() - t0
        return report
    report.volumes = view.volumes
    inv = collect_inventory(view)
    report.inventory = inv
    if advisories:
        report.findings = match(
            inv.packages, advisories, os_id=inv.os.get("ID", ""), os_version=inv.os.get("VERSION_ID", "")
        )
    report.compliance = evaluate(list(_rules(cfg) if rules is None else rules), inv, view)
    report.warnings = list(view.warnings)
    report.seconds = time.perf_counter() - t0
    return report


def _scan_worker(path: str, cfg_dict: dict[str, Any]) -> ScanReport:
    cfg = ScanConfig.from_dict(cfg_dict)
    advisories = load_db(cfg.db) if cfg.db else []
    return scan_image(path, cfg, advisories=advisories)


def scan_many(
    paths: Sequence[str | Path], cfg: ScanConfig, *, on_done: Callable[[ScanReport], None] | None = None
) -> list[ScanReport]:
    """Scan ``paths`` with ``cfg.workers`` processes; reports come back in input order."""
    rules = _rules(cfg)  # fail fast on a bad rule file or database, before any worker starts
    advisories = load_db(cfg.db) if cfg.db else []
    if cfg.workers == 1 or len(paths) == 1:
        out = []
        for p in paths:
            out.append(scan_image(p, cfg, advisories=advisories, rules=rules))
            if on_done:
                on_done(out[-1])
        return out
    results: dict[int, ScanReport] = {}
    with ProcessPoolExecutor(max_workers=min(cfg.workers, len(paths))) as pool:
        futs = {pool.submit(_scan_worker, str(p), cfg.to_dict()): i for i, p in enumerate(paths)}
        for fut in as_completed(futs):
            results[futs[fut]] = fut.result()
            if on_done:
                on_done(results[futs[fut]])
    return [results[i] for i in range(len(paths))]


def exit_code(reports: Sequence[ScanReport], fail_on: str) -> int:
    """0 clean, 1 a finding or failed rule at/above ``fail_on``, 2 an image could not be scanned."""
    threshold = Severity.parse(fail_on)
    if any(r.error for r in reports):
        return 2
    for r in reports:
        if any(f.rank >= threshold for f in r.findings):
            return 1
        if any(c.status is Status.FAIL and Severity.parse(c.severity) >= threshold for c in r.compliance):
            return 1
    return 0
