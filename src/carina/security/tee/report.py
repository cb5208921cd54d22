"""TEE bench records and their comparison (overhead tables, PNG and HTML plots).

:func:`bench_record` runs detection, the micro suite and the workloads in one mode and
returns a carina bench record; every figure says whether it was measured, emulated or
modeled. :func:`compare` matches two records (typically native vs CC, or native vs
emulated) row by row: transfers by direction and size (pinned native memory against the
other side's bounce path), workloads by model, batch, length and pipelining.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from carina.core.bench import Basis, Figure, make_record
from carina.core.errors import ModelFormatError
from carina.security.tee.detect import detect
from carina.security.tee.micro import MicroConfig, run_micro
from carina.security.tee.workloads import WorkloadConfig, run_workloads

__all__ = ["bench_record", "compare", "load_record", "render_compare_html", "render_compare_png"]


def bench_record(
    micro: MicroConfig,
    work: WorkloadConfig,
    *,
    name: str,
    command: str | None = None,
    nvml: Any = None,
    work_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Detect, measure and package everything as one record (``work_rows``: already measured)."""
    report = detect(nvml=nvml)
    micro_rows = run_micro(micro)
    work_rows = run_workloads(work) if work_rows is None else work_rows
    figures = []
    for r in micro_rows:
        if "gbps" in r and r["bench"] in ("h2d", "d2h", "streams_h2d"):
            label = f"{r['bench']}_{r.get('memory', 'pinned')}_{r['bytes']}" + (
                f"_s{r['streams']}" if "streams" in r else ""
            )
            figures.append(Figure(name=label, value=r["gbps"], unit="GB/s", basis=Basis(r["basis"])))
    for r in work_rows:
        tag = f"{r['model']}_b{r['batch']}_s{r['seq']}" + ("_pipe" if r["pipelined"] else "")
        figures.append(
            Figure(name=f"{tag}_tokens_per_s", value=r["tokens_per_s"], unit="tokens/s", basis=Basis(r["basis"]))
        )
    metrics = {
        "mode": micro.mode,
        "detect": report.to_dict(),
        "micro": micro_rows,
        "workloads": work_rows,
        "assumptions": micro.link.to_dict() if micro.mode == "emulated" else {},
    }
    notes = "CC mode not available on this machine; emulated figures model it." if report.gpu_cc.value != "on" else ""
    config = {"micro": micro.to_dict(), "workloads": work.to_dict()}
    return make_record(name=name, figures=figures, config=config, metrics=metrics, command=command, notes=notes)


def load_record(path: str | Path) -> dict[str, Any]:
    """Read a TEE bench record; malformed input raises :class:`ModelFormatError`."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"cannot read record: {exc}", file=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict) or "workloads" not in data["metrics"]:
        raise ModelFormatError("not a carina tee bench record (metrics.workloads missing)", file=str(path))
    return data


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Overheads of record ``b`` relative to record ``a`` (``b/a - 1`` on times).

    Workload ``latency_overhead`` rebuilds both latencies from each side's measured
    transfers and one shared compute time (the smaller of the two: CC does not change
    on-GPU compute, and the smaller one is the less disturbed measurement), so run-to-run
    compute noise cannot fake a speed-up. ``latency_overhead_raw`` is the plain ratio of
    the end-to-end latencies, kept for comparison.
    """
    ma, mb = a["metrics"], b["metrics"]

    def transfers(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for r in rows:
            if r["bench"] in ("h2d", "d2h") and r.get("memory") in ("pinned", "bounce", "pageable"):
                key = (r["bench"], int(r["bytes"]))
                if key not in out or r.get("memory") != "pageable":  # prefer pinned/bounce
                    out[key] = r
        return out

    ta, tb = transfers(ma["micro"]), transfers(mb["micro"])
    rows_t = [
        {
            "bench": k[0],
            "bytes": k[1],
            "a_gbps": ta[k]["gbps"],
            "b_gbps": tb[k]["gbps"],
            "slowdown": tb[k]["seconds"] / ta[k]["seconds"],
            "basis": tb[k]["basis"],
        }
        for k in sorted(set(ta) & set(tb))
    ]

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["model"], r["batch"], r["seq"], r["pipelined"])

    wa = {key(r): r for r in ma["workloads"]}
    rows_w = []
    for r in mb["workloads"]:
        base = wa.get(key(r))
        if base is not None:
            rows_w.append(_workload_overhead(base, r))
    return {"a": a.get("name"), "b": b.get("name"), "transfers": rows_t, "workloads": rows_w}


def _workload_overhead(base: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """Overheads of one workload row; see :func:`compare`."""
    row = {
        "model": r["model"],
        "kind": r["kind"],
        "batch": r["batch"],
        "seq": r["seq"],
        "pipelined": r["pipelined"],
        "basis": r["basis"],
    }
    compute = min(base["compute_s"], r["compute_s"])  # CC leaves compute alone: share the least-disturbed one

    def total(x: dict[str, Any]) -> float:
        if x["pipelined"]:
            return float(max(x["h2d_s"], compute) + x["d2h_s"])
        return float(x["h2d_s"] + compute + x["d2h_s"])

    row["latency_overhead"] = total(r) / total(base) - 1.0
    row["latency_overhead_raw"] = r["latency_s"] / base["latency_s"] - 1.0
    row["transfer_s"] = [base["h2d_s"] + base["d2h_s"], r["h2d_s"] + r["d2h_s"]]
    row["compute_s"] = [base["compute_s"], r["compute_s"]]
    if "ttft_s" in r:
        row["ttft_overhead_raw"] = r["ttft_s"] / base["ttft_s"] - 1.0
        row["itl_overhead_raw"] = r["itl_s"] / base["itl_s"] - 1.0 if base["itl_s"] else None
    return row


def render_compare_png(result: dict[str, Any], path: str | Path | None = None) -> bytes:
    """Latency overhead against batch size, one line per model (and pipelining)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    lines: dict[tuple[str, bool, int], list[tuple[int, float]]] = {}
    for r in result["workloads"]:
        lines.setdefault((r["model"], r["pipelined"], r["seq"]), []).append((r["batch"], 100.0 * r["latency_overhead"]))
    for (model, pipe, seq), pts in sorted(lines.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o",
            ls="--" if pipe else "-",
            label=f"{model} s{seq}{' pipelined' if pipe else ''}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency overhead (%)")
    bases = sorted({r["basis"] for r in result["workloads"]})
    ax.set_title(f"{result['b']} vs {result['a']} ({', '.join(bases)})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    if path is not None:
        Path(path).write_bytes(buf.getvalue())
    return buf.getvalue()


def render_compare_html(result: dict[str, Any]) -> str:
    """A self-contained page: the plot and both tables."""
    png = base64.b64encode(render_compare_png(result)).decode()

    def table(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return "<p>none</p>"
        cols = list(rows[0])
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
        return f"<table border='1' cellspacing='0' cellpadding='3'><tr>{head}</tr>{body}</table>"

    title = html.escape(f"{result['b']} vs {result['a']}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body><h1>{title}</h1>"
        f"<img alt='overhead vs batch' src='data:image/png;base64,{png}'><h2>Workloads</h2>{table(result['workloads'])}"
        f"<h2>Transfers</h2>{table(result['transfers'])}</body></html>"
    )


def _fmt(v: Any) -> str:
    return html.escape(f"{v:.4g}" if isinstance(v, float) else str(v))
