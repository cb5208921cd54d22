"""Turn the harness's rows into carina bench records, a markdown summary and a PNG plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from carina.core.bench import Figure, make_record, results_dir, write_record

LOSS_RTOL_GPU = 2.0**-8  # bf16's unit roundoff: every step's loss within it of plain PyTorch's
LOSS_RTOL_CPU = 1e-4  # fp32 on the CPU: same math, different kernels and orders
REFERENCE_PLAIN = "plain PyTorch uncapped (the ideal's run)"
REFERENCE_CHECKPOINTED = "plain PyTorch uncapped with activation checkpointing (plain's activations did not fit)"


def loss_check(result: dict[str, Any], reference: dict[str, Any] | None, *, gpu: bool, source: str) -> dict[str, Any]:
    """Each step's loss of ``result`` against plain PyTorch's on the same model, weights and tokens.

    ``within`` is the check (every step within ``rtol`` of the reference); ``drift`` (the largest gap
    between the two losses' changes since step 0) and the reference's own descent say whether the
    optimizer tracked plain AdamW's, which the tolerance alone cannot tell over a few steps.
    """
    if result["status"] != "ok":
        return {"within": None, "why": f"{result['status']}: no losses"}
    if reference is None or reference.get("status") != "ok":
        return {"within": None, "why": "no reference: plain PyTorch did not run uncapped in this run"}
    a, b = result["losses"], reference["losses"]
    n = min(len(a), len(b))
    rtol = LOSS_RTOL_GPU if gpu else LOSS_RTOL_CPU
    diffs = [abs(x - y) for x, y in zip(a[:n], b[:n], strict=True)]
    return {
        "reference": source,
        "steps": n,
        "rtol": rtol,
        "within": all(d <= rtol * max(1.0, abs(y)) for d, y in zip(diffs, b, strict=False)),
        "max_abs_diff": max(diffs),
        "last_abs_diff": diffs[-1],
        "drift": max(abs((x - a[0]) - (y - b[0])) for x, y in zip(a[:n], b[:n], strict=True)),
        "reference_descent": b[0] - b[n - 1],
        "reference_losses": b[:n],
    }


def host_check(result: dict[str, Any], budget_gib: float | None) -> dict[str, Any]:
    """The run's peak host RSS against the configuration's host budget (empty without a budget)."""
    if budget_gib is None:
        return {}
    peak = result.get("peak_host_rss_bytes")
    budget = int(budget_gib * 2**30)
    return {"budget_bytes": budget, "peak_host_rss_bytes": peak, "within": None if peak is None else peak <= budget}


def _reference(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    plain = row["results"].get("plain")
    if plain is not None and plain.get("status") == "ok":
        return plain, "plain PyTorch at this configuration"
    return row.get("reference"), row.get("reference_how") or REFERENCE_PLAIN


def _on_gpu(result: dict[str, Any]) -> bool:
    """Whether ``result`` trained on a GPU (bf16 there: the bf16 tolerance), from its own record."""
    return result.get("peak_gpu_bytes") is not None


def _config_name(row: dict[str, Any]) -> str:
    base = row["base"]
    budget = f"{base['gpu_budget_gib']:g}g" if base["gpu_budget_gib"] else "nocap"
    layers = f"{base['layers']}l" if base.get("layers") else ""
    tag = f"{row['tag']}_" if row.get("tag") else ""  # a run's name prefix (--tag), so runs never overwrite
    host = f"_host{base['host_budget_gib']:g}g" if base.get("host_budget_gib") else ""  # the spill configurations
    micro = f"_{base['micro_batches']}micro" if base.get("micro_batches", 1) > 1 else ""  # gradient accumulation
    return f"{tag}{base['shape']}{layers}_{row['tokens']}tok{micro}_{budget}{host}"


def records(rows: list[dict[str, Any]], calib: dict[str, float], command: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for row in rows:
        tokens = row["tokens"]
        ideal = tokens / row["ideal_s"] if row["ideal_s"] else None
        roof = tokens / row["roofline_s"] if row["roofline_s"] else None
        ok = {s: r["tokens_per_s"] for s, r in row["results"].items() if r["status"] == "ok"}
        reference, source = _reference(row)
        first = len(out)  # this configuration's records start here
        for system, result in row["results"].items():
            figures = []
            if result["status"] == "ok":
                peers = {s: v for s, v in ok.items() if s != system}
                if ideal:
                    peers["ideal (unlimited memory)"] = ideal
                figures.append(
                    Figure(
                        name="tokens_per_s",
                        value=result["tokens_per_s"],
                        unit="tokens/s",
                        ceiling=roof,
                        ceiling_source="roofline: max(ideal compute, 4N/H2D, 2N/D2H, N/CPU-AdamW), measured in this run"
                        if roof
                        else "",
                        peers=peers,
                    )
                )
            check = loss_check(result, reference, gpu=_on_gpu(result), source=source) if system != "plain" else {}
            metrics = {
                "status": result["status"],
                "reason": result.get("reason", ""),
                "earlier_record": result.get("earlier_record"),  # a row not run again (earlier.py)
                "stderr_tail": result.get("stderr_tail", []),
                "losses": result.get("losses", []),
                "step_s": result.get("step_s", []),
                "peak_gpu_bytes": result.get("peak_gpu_bytes"),
                "peak_host_rss_bytes": result.get("peak_host_rss_bytes"),
                "allocator": result.get("allocator", {}),
                "settings": result.get("settings", {}),
                "versions": result.get("versions", {}),
                "ideal_tokens_per_s": ideal,
                "ideal_how": row["ideal_how"],
                "roofline_tokens_per_s": roof,
                "calibration": calib,
                "loss_matches_plain": check.get("within"),
                "loss_check": check,
                "host_budget_check": host_check(result, row["base"].get("host_budget_gib")),
            }
            out.append(
                make_record(
                    name=f"offload_peers_{_config_name(row)}_{system}",
                    figures=figures,
                    # the system's own cap (a preset's system_budget may differ from the configuration's)
                    config=row["base"] | {"system": system, "gpu_budget_gib": result["spec"]["gpu_budget_gib"]},
                    metrics=metrics,
                    command=command,
                )
            )
        out.append(_table_record(row, out[first:], command))
    return out


def _table_record(row: dict[str, Any], recs: list[dict[str, Any]], command: str) -> dict[str, Any]:
    """One record per configuration whose ``metrics.rows`` is every system's line, failed ones with their
    reason, and its loss check: what docs/offload.md renders (``<!-- rows: ... -->``)."""
    lines = []
    for rec in recs:
        m, figs = rec["metrics"], rec["figures"]
        check = m.get("loss_check") or {}
        peers = figs[0]["peers"] if figs else {}
        best = max((v["value"] for k, v in peers.items() if not k.startswith("ideal")), default=None)
        lines.append(
            {
                "system": rec["config"]["system"],
                "status": m["status"],
                "tokens_per_s": round(figs[0]["value"]) if figs else "–",
                "vs_best_other": round(figs[0]["value"] / best, 2) if figs and best else "–",
                "vs_ideal": round(figs[0]["value"] / m["ideal_tokens_per_s"], 2)
                if figs and m.get("ideal_tokens_per_s")
                else "–",
                "loss_within_bf16": {True: "yes", False: "no", None: "–"}[check.get("within")],
                "loss_max_abs_diff": check.get("max_abs_diff", "–"),
                "loss_drift": check.get("drift", "–"),
                "host_within_budget": {True: "yes", False: "no", None: "–"}[m["host_budget_check"].get("within")],
                "reason": m.get("reason", "")[:220],
            }
        )
    return make_record(
        name=f"offload_peers_{_config_name(row)}_table",
        figures=[],
        config=row["base"] | {"system": "all (table)"},
        metrics={"rows": lines, "ideal_how": row["ideal_how"], "loss_reference": _reference(row)[1]},
        command=command,
    )


def summary(rows: list[dict[str, Any]]) -> str:
    systems = sorted({s for row in rows for s in row["results"]})
    lines = [
        "| configuration | ideal tok/s | roofline tok/s | " + " | ".join(systems) + " |",
        "|---|---|---|" + "---|" * len(systems),
    ]
    for row in rows:
        cells = []
        for s in systems:
            r = row["results"].get(s)
            if r is None:
                cells.append("–")
            elif r["status"] == "ok":
                cells.append(f"{r['tokens_per_s']:.0f}" + _loss_mark(r, row))
            else:
                cells.append(f"{r['status']}: {r.get('reason', '')[:60]}")
        ideal = f"{row['tokens'] / row['ideal_s']:.0f}" if row["ideal_s"] else "–"
        roof = f"{row['tokens'] / row['roofline_s']:.0f}" if row["roofline_s"] else "–"
        lines.append(f"| {_config_name(row)} | {ideal} | {roof} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _loss_mark(result: dict[str, Any], row: dict[str, Any]) -> str:
    """`` (loss ok)``, `` (loss off: ...)`` or nothing, for a table cell."""
    if result["spec"]["system"] == "plain":
        return ""
    reference, source = _reference(row)
    check = loss_check(result, reference, gpu=_on_gpu(result), source=source)
    if check["within"] is None:
        return ""
    return " (loss ok)" if check["within"] else f" (loss off by {check['max_abs_diff']:.3g})"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = sorted({s for row in rows for s in row["results"]})
    fig, ax = plt.subplots(figsize=(2.5 + 2.2 * len(rows), 4.5))
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        xs = [j + i * width for j in range(len(rows))]
        ys = [(row["results"].get(s) or {}).get("tokens_per_s") or 0 for row in rows]
        ax.bar(xs, ys, width, label=s)
    for j, row in enumerate(rows):
        for key, style, label in (("ideal_s", "--", "ideal"), ("roofline_s", ":", "roofline")):
            if row[key]:
                ax.hlines(
                    row["tokens"] / row[key],
                    j - width / 2,
                    j + 0.8 - width / 2,
                    linestyles=style,  # type: ignore[arg-type]
                    colors="black",
                    label=label if j == 0 else "_nolegend_",
                )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [_config_name(r) for r in rows])
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_outputs(
    rows: list[dict[str, Any]], calib: dict[str, float], *, command: str, out: Path | None = None
) -> list[Path]:
    recs = records(rows, calib, command)
    paths = [write_record(r, directory=out) for r in recs]
    folder = out or results_dir(recs[0]["machine"]["label"])
    tag = f"{rows[0]['tag']}_" if rows and rows[0].get("tag") else ""
    configs = {_config_name(r) for r in rows}
    if tag and len(configs) == 1:  # one configuration per tagged run (a lane): name the files after it, so
        tag = f"{configs.pop()}_"  # the lanes of one session, gathered into one folder, never collide
    md = folder / f"offload_peers_{tag}summary.md"
    md.write_text(f"Command: `{command}`\n\n" + summary(rows))
    png = folder / f"offload_peers_{tag}plot.png" if tag else folder / "offload_peers.png"
    plot(rows, png)
    return [*paths, md, png]
