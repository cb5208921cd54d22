"""Benchmark: STRonG-compatible scoring vs the original's approach, larger models, robustness.

Measured in one run on this machine, each case in a fresh process (wall time and peak RSS):

* carina's compiled path search on testcase, openstack_tcp_CFA and openstack_shc_CFA
  (exact; numbers checked against the original's published figures);
* the peer: the original's approach (list every simple path with networkx, score each in
  Python), on the same models;
* the OpenStack models with their OS stencils not collapsed (written at run time from the
  shared CFA models: each OS instance keeps its seven subnodes with the collapsed scores),
  scored with certified bounds (strong) and exactly (reach), and the weakest cut;
* SHC < TCP under 1,000 trials of +-10 % relative score noise (strong and reach).

Run: ``.venv/bin/python benchmarks/security/bench_risk.py`` (needs ../shared/data/strong).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import math
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.testing import shared_data

REFERENCE = {  # the original's figures (STRonG on Debian graph-tool 2.45, same models)
    "testcase": {"paths": 10, "risk": 2.493951, "wall_s": 0.5},
    "tcp_CFA": {"paths": 4584, "risk": 0.0870384, "wall_s": 1.0, "rss_mb": 204},
    "shc_CFA": {"paths": 518_806, "risk": 0.0468293, "wall_s": 121.0, "rss_mb": 485},
}
FILES = {
    "testcase": "test/testcase.yml",
    "tcp_CFA": "openstack/openstack_tcp_CFA.yml",
    "shc_CFA": "openstack/openstack_shc_CFA.yml",
}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _carina(path: str, options: dict[str, Any], scorer: str = "strong") -> dict[str, Any]:
    from carina.security.risk.graph import RiskGraph
    from carina.security.risk.loader import load_model
    from carina.security.risk.paths import have_numba
    from carina.security.risk.scoring import score

    warm = RiskGraph.from_model(load_model(shared_data("strong") / FILES["testcase"]))
    score(warm, "strong")  # compile (or load the cached kernel) before timing
    t0 = time.perf_counter()
    (r,) = score(load_model(path), scorer, **options)
    wall = time.perf_counter() - t0
    keep = {k: r.details.get(k) for k in ("paths", "p_total", "shift", "method", "states", "prune_below", "cut")}
    return {"wall_s": wall, "rss_mb": _rss_mb(), "value": r.value, "bounds": r.bounds, "numba": have_numba(), **keep}


def _naive(path: str) -> dict[str, Any]:
    import networkx as nx

    from carina.security.risk.graph import RiskGraph
    from carina.security.risk.loader import load_model

    t0 = time.perf_counter()
    g = RiskGraph.from_model(load_model(path))
    nxg = nx.Graph()
    nxg.add_edges_from(g.edges())
    deg = g.out_degree
    count, risk, log_keep = 0, 0.0, 0.0
    for a in g.attackers:
        for p in nx.all_simple_paths(nxg, int(a), int(g.targets[0]), cutoff=max(50, int(0.85 * g.n))):
            prob = math.prod(float(g.probability[v]) for v in p[1:])
            imp = sum(float(g.impact[v]) * math.sqrt(deg[v]) for v in p[1:])
            count, risk, log_keep = count + 1, risk + prob * imp, log_keep + math.log1p(-prob)
    return {"wall_s": time.perf_counter() - t0, "rss_mb": _rss_mb(), "value": risk, "paths": count}


def _robustness(trials: int) -> dict[str, Any]:
    from carina.security.risk.graph import RiskGraph
    from carina.security.risk.loader import load_model
    from carina.security.risk.noise import perturb
    from carina.security.risk.scoring import make_scorer

    tcp = RiskGraph.from_model(load_model(shared_data("strong") / FILES["tcp_CFA"]))
    shc = RiskGraph.from_model(load_model(shared_data("strong") / FILES["shc_CFA"]))
    out: dict[str, Any] = {}
    for name in ("strong", "reach"):
        scorer = make_scorer(name)
        held = 0
        t0 = time.perf_counter()
        for trial in range(trials):
            a = scorer.score(perturb(tcp, 10.0, seed=7, trial=trial))[0].value
            b = scorer.score(perturb(shc, 10.0, seed=7, trial=trial))[0].value
            held += b < a
        out[name] = {"trials": trials, "shc_below_tcp": held / trials, "wall_s": time.perf_counter() - t0}
    return out


def open_models(directory: Path) -> dict[str, Path]:
    """Write the OpenStack models with their OS stencils not collapsed; return their paths."""
    src = shared_data("strong") / "openstack"
    for f in src.glob("*.yml"):
        shutil.copy(f, directory / f.name)
    out = {}
    for key in ("tcp", "shc"):
        data = yaml.safe_load((src / f"openstack_{key}_CFA.yml").read_text())
        for body in data.values():
            if isinstance(body, dict) and body.get("collapsed"):
                body["probability"] = body.pop("cprobability")
                body["impact"] = body.pop("cimpact")
                del body["collapsed"]
        path = directory / f"openstack_{key}_open.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out[f"{key}_open"] = path
    return out


def _run(fn: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--skip-naive-shc", action="store_true", help="skip the slow peer run on shc_CFA")
    args = ap.parse_args()
    results: dict[str, Any] = {"exact": {}, "naive": {}, "open": {}}
    for key, rel in FILES.items():
        path = str(shared_data("strong") / rel)
        results["exact"][key] = _run(_carina, path, {})
        if key != "shc_CFA" or not args.skip_naive_shc:
            results["naive"][key] = _run(_naive, path)
        print(key, results["exact"][key]["wall_s"], results["naive"].get(key, {}).get("wall_s"), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for key, path in open_models(Path(tmp)).items():
            results["open"][key] = {
                "strong": _run(_carina, str(path), {"rel_tolerance": 0.02, "time_budget_s": 20.0}),
                "reach": _run(_carina, str(path), {}, "reach"),
                "mincut": _run(_carina, str(path), {}, "mincut"),
            }
            print(key, {k: round(v["wall_s"], 2) for k, v in results["open"][key].items()}, flush=True)
    results["robustness"] = _run(_robustness, args.trials)
    write_record(_record(results, args))


def _record(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    figures = []
    for key, ref in REFERENCE.items():
        mine, naive = results["exact"][key], results["naive"].get(key)
        peers = {"naive enumeration (networkx, same run)": naive["wall_s"]} if naive else {}
        figures.append(Figure(name=f"{key}_wall", value=mine["wall_s"], unit="s", higher_is_better=False, peers=peers))
        figures.append(
            Figure(
                name=f"{key}_rel_error_vs_original",
                value=abs(mine["value"] / ref["risk"] - 1),
                unit="1",
                higher_is_better=False,
            )
        )
    for key, per in results["open"].items():
        s = per["strong"]
        figures.append(Figure(name=f"{key}_strong_wall", value=s["wall_s"], unit="s", higher_is_better=False))
        lo, hi = s["bounds"] or (s["value"], s["value"])
        figures.append(Figure(name=f"{key}_strong_bound_width", value=(hi - lo) / lo, unit="1", higher_is_better=False))
        figures.append(Figure(name=f"{key}_strong_rss", value=s["rss_mb"], unit="MB", higher_is_better=False))
        figures.append(Figure(name=f"{key}_reach_wall", value=per["reach"]["wall_s"], unit="s", higher_is_better=False))
    for name, r in results["robustness"].items():
        figures.append(
            Figure(
                name=f"shc_below_tcp_{name}_noise10",
                value=r["shc_below_tcp"],
                unit="fraction",
                ceiling=1.0,
                basis=Basis.MODELED,
            )
        )
    notes = (
        "Original STRonG figures (wall 121 s / 485 MB on shc_CFA) are from the background notes on the same 2-core "
        "machine class, not re-run here (graph-tool is not installed); the naive peer is the original's approach "
        "(enumerate, then score each path in Python) measured in this run. Uncollapsed models are written at run time."
    )
    return make_record(
        name="security_risk_strong",
        figures=figures,
        config=vars(args),
        metrics={**results, "reference": REFERENCE},
        notes=notes,
        command=" ".join(["python", *sys.argv]),
    )


if __name__ == "__main__":
    main()
