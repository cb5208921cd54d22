"""Reports of risk scores: terminal rows, JSON, and a layered drawing as PNG or HTML.

The drawing puts each layer on its own row (top layer first, following the layers'
``upper``/``lower`` links), draws every link in grey, and highlights the most likely
attack paths in colour, the attackers in blue and the targets in green.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from carina.security.risk.graph import RiskGraph
from carina.security.risk.model import Layer
from carina.security.risk.scoring import TargetScore

__all__ = ["draw_png", "layer_order", "render_html", "score_rows"]

_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


def score_rows(scores: list[TargetScore]) -> list[dict[str, Any]]:
    """One row per (scorer, target) for a terminal table."""
    rows = []
    for s in scores:
        d = s.details
        extra = ""
        if s.scorer == "strong":
            extra = f"paths={d['paths']} P_total={d['p_total']:.6g} shift={d['shift']:.6g}"
        elif s.scorer == "mincut":
            extra = "cut=" + ",".join(d["cut"])
        elif s.scorer == "reach":
            extra = f"method={d['method']}"
        elif s.scorer == "kpaths" and d["paths"]:
            extra = "best=" + ">".join(n.split(".")[-2] + "." + n.split(".")[-1] for n in d["paths"][0]["nodes"])
        bounds = f"[{s.bounds[0]:.6g}, {s.bounds[1]:.6g}]" if s.bounds else ""
        rows.append(
            {
                "scorer": s.scorer,
                "target": s.target,
                "metric": s.metric,
                "value": f"{s.value:.7g}",
                "bounds": bounds,
                "notes": extra,
            }
        )
    return rows


def layer_order(layers: dict[str, Layer], used: set[str]) -> list[str]:
    """Layers top to bottom: STRonG's chain of ``upper`` links from the top, then the rest."""
    order: list[str] = []
    current = "none"
    while True:
        nxt = next((n for n, layer in layers.items() if layer.upper == current and n not in order), None)
        if nxt is None:
            break
        order.append(nxt)
        current = nxt
    order += [n for n in layers if n not in order]
    return [n for n in order if n in used] + sorted(used - set(order))


def _positions(graph: RiskGraph, layers: dict[str, Layer]) -> dict[int, tuple[float, float]]:
    order = layer_order(layers, set(graph.layers))
    pos = {}
    for row, layer in enumerate(order):
        members = [v for v in range(graph.n) if graph.layers[v] == layer]
        for i, v in enumerate(members):
            pos[v] = ((i + 0.5) / len(members) + 0.03 * (row % 2), -float(row))
    return pos


def draw_png(
    graph: RiskGraph,
    layers: dict[str, Layer],
    paths: list[list[int]],
    path: str | Path | None = None,
    *,
    title: str = "",
) -> bytes:
    """Draw the layered graph with ``paths`` highlighted; write to ``path`` if given; return PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = _positions(graph, layers)
    order = layer_order(layers, set(graph.layers))
    fig, ax = plt.subplots(figsize=(14, 1.6 * max(3, len(order))), dpi=100)
    for v, w in graph.edges():
        if v < w or graph.directed:
            ax.plot(*zip(pos[v], pos[w], strict=True), color="#cccccc", lw=0.8, zorder=1)
    for k, p in enumerate(paths):
        xy = [pos[v] for v in p]
        ax.plot(
            [x for x, _ in xy],
            [y for _, y in xy],
            color=_COLOURS[k % len(_COLOURS)],
            lw=3.0 - 0.3 * k,
            alpha=0.8,
            zorder=2,
        )
    attackers, targets = set(graph.attackers.tolist()), set(graph.targets.tolist())
    for v, (x, y) in pos.items():
        colour = (
            "#1f77b4"
            if v in attackers
            else "#2ca02c"
            if v in targets
            else (1.0, 1.0 - graph.probability[v], 1.0 - graph.probability[v])
        )
        ax.scatter([x], [y], s=90, color=colour, edgecolors="black", linewidths=0.5, zorder=3)
        label = graph.names[v].split(".", 1)[-1]
        ax.annotate(
            f"{label} {graph.probability[v]:.3g}", (x, y), fontsize=6, rotation=25, ha="left", va="bottom",
            xytext=(2, 4), textcoords="offset points",
        )  # fmt: skip
    for row, layer in enumerate(order):
        ax.text(-0.02, -row, layer, ha="right", va="center", fontsize=9, weight="bold")
    ax.set_axis_off()
    ax.set_xlim(-0.12, 1.08)
    if title:
        ax.set_title(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data


def render_html(
    graph: RiskGraph,
    layers: dict[str, Layer],
    scores: list[TargetScore],
    paths: list[list[int]],
    *,
    title: str = "risk report",
) -> str:
    """A self-contained HTML page: the drawing, the score table and the top paths."""
    png = base64.b64encode(draw_png(graph, layers, paths, title=title)).decode()
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in score_rows(scores)
    )
    head = "".join(f"<th>{c}</th>" for c in ("scorer", "target", "metric", "value", "bounds", "notes"))
    items = "".join(
        f'<li style="color:{_COLOURS[k % len(_COLOURS)]}">'
        + html.escape(" → ".join(graph.names[v] for v in p))
        + "</li>"
        for k, p in enumerate(paths)
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><img alt='layered graph' src='data:image/png;base64,{png}'>"
        f"<table border='1' cellspacing='0' cellpadding='4'><tr>{head}</tr>{rows}</table>"
        f"<h2>Most likely attack paths</h2><ol>{items}</ol></body></html>"
    )
