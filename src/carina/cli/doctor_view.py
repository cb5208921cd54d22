"""Renders a doctor report as tables or JSON."""

from __future__ import annotations

from typing import Any

from carina.core.doctor import Report
from carina.core.progress import console, emit_json, print_table, to_jsonable


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def show(report: Report, *, json_out: bool, io: dict[str, Any] | None = None) -> None:
    """Print ``report`` (and the IO backend choice): JSON to stdout, or a few rich tables."""
    if json_out:
        emit_json({**to_jsonable(report), "io_backend": io})
        return
    t = report.torch
    gpus = "; ".join(f"{g['name']} {_gb(g['memory_bytes'])} cc {g['compute_capability']}" for g in t["gpus"])
    rows = [
        ("carina", report.carina, ""),
        ("python", report.python["version"], report.python["executable"]),
        (
            "system",
            f"{report.system['os']} {report.system['kernel']}",
            f"{report.system['cpus']} CPUs, {_gb(report.system['memory_bytes'])}",
        ),
        ("torch", t["version"] or "not installed", f"CUDA build {t.get('cuda_build')}"),
        ("GPUs", gpus or "none", f"driver {t.get('driver')}" if gpus else ""),
        ("pinned memory", "yes" if report.pinned_memory["works"] else "no", report.pinned_memory["reason"]),
        ("io_uring", "yes" if report.io_uring["available"] else "no", report.io_uring["reason"]),
    ]
    if io is not None:
        skipped = "; ".join(f"skipped {n}: {', '.join(r)}" for n, r in (io.get("skipped") or {}).items())
        rows.append(("io backend", str(io.get("backend")), skipped or str(io.get("reason", ""))))
        gathers = io.get("gather_path")
        if gathers:
            rows.append((f"batched gathers ({gathers['device']})", str(gathers["path"]), gathers["why"]))
    for p in report.paths:
        rows.append(
            (
                f"path {p.path}",
                f"{p.filesystem} on {p.device}",
                f"O_DIRECT {'yes' if p.o_direct else 'no'}: {p.o_direct_reason}; free {_gb(p.free_bytes)}",
            )
        )
    for tool in report.tools:
        rows.append((f"tool {tool.name}", "yes" if tool.path else "missing", tool.version or tool.install))
    for name, extra in report.extras.items():
        rows.append((f"extra [{name}]", "yes" if extra["installed"] else "no", ", ".join(extra["missing"])))
    print_table(rows, columns=["check", "status", "details"], title="carina doctor")
    if report.missing:
        print_table([(m.what, m.fix) for m in report.missing], columns=["missing", "fix"], title="to fix")
    else:
        console().print("nothing missing")
