"""Rows a run need not measure again: a system that failed at this very configuration in a committed record.

A preset's ``known`` maps a system to the record (a path under ``benchmarks/results/``) of an earlier run
in which it failed at the same configuration. The harness then writes that system's row as ``not run``
with the earlier record named, its status, reason, commit and versions, instead of spending device time
on a failure it already recorded. The record must match the configuration (model shape, layers,
vocabulary, tokens and sequence length, micro-batches, GPU cap and host budget) and must not be ``ok``;
otherwise the system runs as usual. ``--rerun-known`` runs every system.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "results"
# what makes two runs the same configuration (steps and warm-up do not change whether a system fits)
SAME = ("shape", "layers", "vocab", "tokens_per_step", "seq_len", "micro_batches", "gpu_budget_gib", "host_budget_gib")
DEFAULTS: dict[str, Any] = {"micro_batches": 1, "host_budget_gib": None, "vocab": 32000}  # older records lack them


def known_row(spec: dict[str, Any], relpath: str, results: Path = RESULTS) -> dict[str, Any] | None:
    """The ``not run`` row of ``spec``'s system from its earlier failed record, or None when it must run.

    None when the record is missing, ran ``ok``, or was another configuration: the system then runs.
    """
    path = results / relpath
    if not path.exists():
        return None
    rec = json.loads(path.read_text())
    cfg, metrics = rec["config"], rec["metrics"]
    if cfg.get("system") != spec["system"] or metrics.get("status") in (None, "ok"):
        return None
    if any(cfg.get(k, DEFAULTS.get(k)) != spec.get(k, DEFAULTS.get(k)) for k in SAME):
        return None
    versions = ", ".join(f"{k} {v}" for k, v in sorted(metrics.get("versions", {}).items()))
    why = (
        f"not run again: {metrics['status']} at this configuration in {relpath} "
        f"(commit {str(rec.get('git_sha'))[:10]}, {versions}): {metrics.get('reason', '')}"
    )
    return {"spec": spec, "status": "not run", "reason": why, "earlier_record": relpath}
