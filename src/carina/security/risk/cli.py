"""``carina risk``: check, score, list paths, diff designs and draw reports."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Layered-graph risk quantification of system stacks.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ModelArg = Annotated[
    Path, typer.Argument(help="Model YAML (STRonG's dialect or carina's).", exists=True, dir_okay=False)
]
ScorerOpt = Annotated[
    str, typer.Option("--scorer", "-s", help="Comma-separated scorers: strong, reach, mincut, kpaths.")
]
GroupProbOpt = Annotated[
    list[str] | None, typer.Option("--group-prob", "-P", help="Override a group's probability: NAME:P (repeatable).")
]
GroupPrioOpt = Annotated[bool, typer.Option("--group-priority", "-G", help="Group probabilities beat written ones.")]
DirectedOpt = Annotated[bool, typer.Option("--directed", "-u", help="Links are one-way (STRonG's -u).")]


def _load(path: Path, group_prob: list[str] | None = None, group_priority: bool = False, directed: bool = False) -> Any:
    from carina.core.errors import ConfigError
    from carina.security.risk.expand import ExpandConfig
    from carina.security.risk.loader import load_model

    overrides = {}
    for item in group_prob or []:
        name, _, prob = item.partition(":")
        try:
            overrides[name] = float(prob)
        except ValueError:
            raise ConfigError(f"--group-prob wants NAME:PROBABILITY, got {item!r}", key="group_prob") from None
    model = load_model(path, ExpandConfig(group_overrides=overrides, group_priority=group_priority))
    model.directed = model.directed or directed
    return model


def _scorers(names: str, max_edges: int, prune_below: float) -> list[Any]:
    from carina.security.risk.scoring import make_scorer

    out = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name == "strong":
            out.append(make_scorer(name, max_edges=max_edges, prune_below=prune_below))
        else:
            out.append(make_scorer(name))
    return out


@app.command()
def check(model: ModelArg, json_out: JsonOpt = False) -> None:
    """Load and check a model; print what it expands to."""
    from carina.core.progress import emit_json, print_table
    from carina.security.risk.loader import load_model

    m = load_model(model)
    summary = {
        "files": m.files,
        "nodes": len(m.nodes),
        "links": len(m.links),
        "layers": list(m.layers),
        "attackers": m.attackers,
        "targets": m.targets,
    }
    if json_out:
        emit_json({**summary, "node_scores": {n.name: [n.probability, n.impact] for n in m.nodes.values()}})
        return
    print_table([{"item": k, "value": v} for k, v in summary.items()], columns=["item", "value"], title=str(model))


@app.command()
def score(
    model: ModelArg,
    scorer: ScorerOpt = "strong,reach,mincut,kpaths",
    max_edges: Annotated[int, typer.Option(help="Longest path in edges (0: STRonG's default).")] = 0,
    prune_below: Annotated[float, typer.Option(help="Certified pruning threshold for strong (0: exact).")] = 0.0,
    html: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    png: Annotated[Path | None, typer.Option(help="Write the layered drawing here.")] = None,
    top: Annotated[int, typer.Option(help="Paths to highlight in drawings.")] = 5,
    group_prob: GroupProbOpt = None,
    group_priority: GroupPrioOpt = False,
    directed: DirectedOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Score every target of a model with the chosen scorers."""
    from carina.core.progress import emit_json, print_table, progress
    from carina.security.risk.graph import RiskGraph
    from carina.security.risk.report import score_rows

    m = _load(model, group_prob, group_priority, directed)
    graph = RiskGraph.from_model(m)
    scores = []
    impls = _scorers(scorer, max_edges, prune_below)
    with progress(transient=True) as bar:
        task = bar.add_task("scoring", total=len(impls))
        for impl in impls:
            scores.extend(impl.score(graph))
            bar.advance(task)
    if html or png:
        _draw(graph, m.layers, scores, top, html, png, title=model.name)
    if json_out:
        emit_json({"model": str(model), "scores": [s.to_dict() for s in scores]})
        return
    print_table(
        score_rows(scores), columns=["scorer", "target", "metric", "value", "bounds", "notes"], title=str(model)
    )


def _draw(graph: Any, layers: Any, scores: Any, top: int, html: Path | None, png: Path | None, *, title: str) -> None:
    from carina.security.risk.cut import most_likely_paths
    from carina.security.risk.report import draw_png, render_html

    paths = [p for t in graph.targets for p, _ in most_likely_paths(graph, int(t), top)]
    if png:
        draw_png(graph, layers, paths, png, title=title)
    if html:
        html.write_text(render_html(graph, layers, scores, paths, title=title))


@app.command()
def paths(
    model: ModelArg,
    k: Annotated[int, typer.Option("-k", help="How many paths per target.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """The k most likely attack paths to every target."""
    from carina.core.progress import emit_json, print_table
    from carina.security.risk.loader import load_model
    from carina.security.risk.scoring import score as run

    results = run(load_model(model), "kpaths", k=k)
    if json_out:
        emit_json({"model": str(model), "targets": [r.to_dict() for r in results]})
        return
    rows = [
        {"target": r.target, "rank": i + 1, "probability": f"{p['probability']:.4g}", "path": " > ".join(p["nodes"])}
        for r in results
        for i, p in enumerate(r.details["paths"])
    ]
    print_table(rows, columns=["target", "rank", "probability", "path"], title=str(model))


@app.command()
def diff(
    before: ModelArg,
    after: ModelArg,
    scorer: ScorerOpt = "strong,reach,mincut,kpaths",
    noise: Annotated[float, typer.Option(help="Score noise in percent for robustness trials.")] = 10.0,
    noise_model: Annotated[str, typer.Option(help="relative or strong (STRonG's -E).")] = "relative",
    trials: Annotated[int, typer.Option(help="Noisy trials per scorer (0: none).")] = 100,
    seed: Annotated[int, typer.Option(help="Noise seed.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Per-target change in every score between two designs, its causes and its robustness."""
    from carina.core.progress import emit_json, print_table
    from carina.security.risk.diff import DiffConfig, diff_models
    from carina.security.risk.loader import load_model
    from carina.security.risk.noise import NoiseModel

    names = [s.strip() for s in scorer.split(",") if s.strip()]
    cfg = DiffConfig(scorers=names, noise=noise, noise_model=NoiseModel(noise_model), trials=trials, seed=seed)
    report = diff_models(load_model(before), load_model(after), cfg)
    if json_out:
        emit_json({"before": str(before), "after": str(after), **report})
        return
    rows = []
    for target, per in report["targets"].items():
        for name in names:
            r = per[name]
            held = r.get("robustness", {}).get("order_held")
            rows.append(
                {
                    "target": target,
                    "scorer": name,
                    "metric": r["metric"],
                    "before": f"{r['before']:.6g}",
                    "after": f"{r['after']:.6g}",
                    "ratio": f"{r['ratio']:.3f}" if r["ratio"] is not None else "",
                    "order held": "" if held is None else f"{held:.0%}",
                }
            )
    columns = ["target", "scorer", "metric", "before", "after", "ratio", "order held"]
    print_table(rows, columns=columns, title=f"{before.name} -> {after.name}")
