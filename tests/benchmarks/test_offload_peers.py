"""The peer harness of benchmarks/offload/peers runs every system, and never drops one silently."""

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "offload" / "peers"))

import harness  # noqa: E402
import report  # noqa: E402
from workload import RunSpec  # noqa: E402

from carina.core.bench import load_records  # noqa: E402


@pytest.fixture(scope="module")
def tiny_rows():
    base = RunSpec(system="plain", shape="tiny", tokens_per_step=128, seq_len=32, steps=2, warmup=1, device="cpu")
    results = {
        s: harness.run_one(RunSpec(**(asdict(base) | {"system": s})), timeout=300)
        for s in ("plain", "carina", "deepspeed_zero3_offload", "torchao_cpu_offload")
    }
    return [
        {
            "tokens": 128,
            "base": asdict(base),
            "ideal_s": 128 / results["plain"]["tokens_per_s"],
            "ideal_how": "measured",
            "roofline_s": None,
            "results": results,
        }
    ]


@pytest.mark.slow
def test_harness_rows_records_table_and_plot(tiny_rows, tmp_path):
    results = tiny_rows[0]["results"]
    assert results["plain"]["status"] == "ok" and results["carina"]["status"] == "ok"
    assert results["carina"]["losses"] == results["plain"]["losses"]  # fp32 on the CPU: bitwise
    for peer in ("deepspeed_zero3_offload", "torchao_cpu_offload"):
        assert results[peer]["status"] == "unavailable" and results[peer]["reason"]
    paths = report.write_outputs(tiny_rows, {"cpu_adamw_params_per_s": 1e8}, command="test", out=tmp_path)
    recs = load_records([p for p in paths if p.suffix == ".json"])
    assert {r["config"]["system"] for r in recs} == {
        "plain",
        "carina",
        "deepspeed_zero3_offload",
        "torchao_cpu_offload",
    }
    carina = next(r for r in recs if r["config"]["system"] == "carina")
    assert carina["metrics"]["loss_matches_plain"] is True
    assert carina["figures"][0]["peers"]["plain"]["value"] == pytest.approx(
        tiny_rows[0]["results"]["plain"]["tokens_per_s"]
    )
    table = (tmp_path / "offload_peers_summary.md").read_text()
    assert "unavailable: DeepSpeed ZeRO offload needs a CUDA device" in table
    assert (tmp_path / "offload_peers.png").read_bytes()[:4] == b"\x89PNG"


def test_parameter_count_of_the_shapes():
    assert harness.n_params(RunSpec(system="plain", shape="7b")) == pytest.approx(6.74e9, rel=0.01)
    assert harness.n_params(RunSpec(system="plain", shape="13b")) == pytest.approx(13.0e9, rel=0.02)


def test_roofline_is_the_slowest_bound():
    spec = RunSpec(system="carina", shape="7b")
    calib = {"h2d_gbps": 54.5, "d2h_gbps": 54.6, "cpu_adamw_params_per_s": 1e9}
    n = harness.n_params(spec)
    assert harness.roofline_step_s(spec, 1.0, calib) == pytest.approx(max(1.0, 4 * n / 54.5e9, n / 1e9))
    assert harness.roofline_step_s(spec, None, calib) is None
    assert json.dumps(harness.PRESETS)  # presets are plain data
