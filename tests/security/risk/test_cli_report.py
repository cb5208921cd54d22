"""The ``carina risk`` commands, reports and the design diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carina.core.errors import ModelFormatError
from carina.security.risk.cli import app
from carina.security.risk.diff import DiffConfig, diff_models
from carina.security.risk.graph import RiskGraph
from carina.security.risk.loader import load_model
from carina.security.risk.noise import NoiseModel
from carina.security.risk.report import draw_png, render_html
from carina.security.risk.scoring import score
from carina.testing import shared_data

EXAMPLES = Path(__file__).resolve().parents[3] / "src" / "carina" / "security" / "risk" / "examples"
runner = CliRunner()


def _strong(rel: str) -> Path:
    return shared_data("strong") / rel


def test_score_json_reproduces_testcase() -> None:
    res = runner.invoke(app, ["score", str(_strong("test/testcase.yml")), "--json", "-s", "strong,reach"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    strong, reach = out["scores"]
    assert strong["details"]["paths"] == 10 and round(strong["value"], 6) == 2.493951
    assert reach["metric"] == "p_reach" and reach["exact"] and 0 < reach["value"] < 1


def test_score_cli_group_override_changes_the_score() -> None:
    args = ["score", str(_strong("test/testcase.yml")), "--json", "-s", "strong"]
    base = json.loads(runner.invoke(app, args).stdout)["scores"][0]["value"]
    res = runner.invoke(app, [*args, "-P", "groupA:0.05"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scores"][0]["value"] < base
    bad = runner.invoke(app, [*args, "-P", "groupA"])
    assert bad.exit_code != 0 and "NAME:PROBABILITY" in str(bad.exception)


def test_check_reports_located_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("l: {type: layer}\nattacker: [l.a]\ntarget: [l.a]\na: {layer: l, probability: 2}\n")
    res = runner.invoke(app, ["check", str(bad)])
    assert res.exit_code != 0
    assert isinstance(res.exception, ModelFormatError)
    assert res.exception.context["line"] == 4


def test_paths_and_reports(tmp_path: Path) -> None:
    res = runner.invoke(app, ["paths", str(_strong("test/testcase.yml")), "-k", "3", "--json"])
    rows = json.loads(res.stdout)["targets"][0]["details"]["paths"]
    assert len(rows) == 3 and rows[0]["probability"] >= rows[1]["probability"] >= rows[2]["probability"]
    html, png = tmp_path / "r.html", tmp_path / "r.png"
    res = runner.invoke(app, ["score", str(_strong("test/testcase.yml")), "--html", str(html), "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<table" in html.read_text() and "baselayer.node2" in html.read_text()


def test_report_functions_draw_paths() -> None:
    model = load_model(_strong("test/testcase.yml"))
    g = RiskGraph.from_model(model)
    data = draw_png(g, model.layers, [[9, 2, 0, 1, 8]])
    assert data.startswith(b"\x89PNG")
    page = render_html(g, model.layers, score(g, "kpaths"), [[9, 2, 0, 1, 8]])
    assert "data:image/png;base64," in page and "→" in page


def test_shc_lowers_risk_under_every_path_scorer_and_under_noise() -> None:
    before = load_model(_strong("openstack/openstack_tcp_CFA.yml"))
    after = load_model(_strong("openstack/openstack_shc_CFA.yml"))
    cfg = DiffConfig(scorers=["reach", "strong"], trials=8, noise=10.0)
    report = diff_models(before, after, cfg)
    per = report["targets"]["services.rabbitmq.core"]
    assert per["strong"]["ratio"] == pytest.approx(0.0468293 / 0.0870384, rel=1e-5)
    assert per["reach"]["after"] < per["reach"]["before"]
    assert per["strong"]["robustness"]["order_held"] == 1.0
    assert per["reach"]["robustness"]["order_held"] == 1.0
    assert "os.snicOS.grouped" in report["changes"]["nodes_added"]
    assert "os.fwOS.grouped" in report["changes"]["nodes_removed"]
    assert per["strong"]["causes"][0]["change"] < 0
    assert any(p["new"] for p in per["paths"]["after"]) or any(p["gone"] for p in per["paths"]["before"])


def test_carina_example_diff_cli_json() -> None:
    res = runner.invoke(
        app,
        [
            "diff",
            str(EXAMPLES / "before.yml"),
            str(EXAMPLES / "after.yml"),
            "--json",
            "--trials",
            "5",
            "-s",
            "strong,reach,mincut",
        ],
    )
    assert res.exit_code == 0, res.output
    per = json.loads(res.stdout)["targets"]["apps.scheduler.core"]
    assert per["strong"]["after"] < per["strong"]["before"]
    assert per["reach"]["after"] < per["reach"]["before"]
    assert per["mincut"]["robustness"]["trials"] == 5


def test_strong_noise_model_perturbs_within_clip() -> None:
    from carina.security.risk.noise import perturb

    g = RiskGraph.from_model(load_model(_strong("test/testcase.yml")))
    noisy = perturb(g, 10.0, seed=1, trial=0, model=NoiseModel.STRONG)
    assert ((noisy.probability >= 0) & (noisy.probability <= 1)).all()
    assert (noisy.probability != g.probability).sum() >= g.n - 1  # the attacker keeps its score
    again = perturb(g, 10.0, seed=1, trial=0, model=NoiseModel.STRONG)
    assert (again.probability == noisy.probability).all()
