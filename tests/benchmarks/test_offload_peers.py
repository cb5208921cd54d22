"""The peer harness of benchmarks/offload/peers runs every system, and never drops one silently."""

import json
import os
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
    assert results["torchao_cpu_offload"]["status"] == "unavailable" and results["torchao_cpu_offload"]["reason"]
    ds = results["deepspeed_zero3_offload"]  # runs on DeepSpeed's CPU accelerator where it is installed
    assert (ds["status"], ds["reason"]) == ("unavailable", "not installed: deepspeed") or ds["status"] == "ok"
    paths = report.write_outputs(tiny_rows, {"cpu_adamw_params_per_s": 1e8}, command="test", out=tmp_path)
    recs = load_records([p for p in paths if p.suffix == ".json" and not p.stem.endswith("_table")])
    [table_rec] = load_records([p for p in paths if p.stem.endswith("_table")])
    table_rows = {r["system"]: r for r in table_rec["metrics"]["rows"]}
    assert table_rows["carina"]["loss_within_bf16"] == "yes" and table_rows["plain"]["loss_within_bf16"] == "–"
    assert table_rows["torchao_cpu_offload"]["reason"] == "CPUOffloadOptimizer needs a CUDA device"
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
    assert "unavailable: CPUOffloadOptimizer needs a CUDA device" in table
    assert "(loss ok)" in table  # carina's cell: every step's loss within tolerance of plain's
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


def _ok(losses):
    return {"status": "ok", "losses": losses, "spec": {"system": "x", "device": "cuda"}}


def test_loss_check_every_step_against_the_reference():
    ref = _ok([10.80, 10.79, 10.78])
    close = report.loss_check(_ok([10.801, 10.788, 10.781]), ref, gpu=True, source="plain")
    assert close["within"] is True and close["steps"] == 3
    assert close["max_abs_diff"] == pytest.approx(0.002) and close["reference_descent"] == pytest.approx(0.02)
    # one step off by more than bf16's unit roundoff (2^-8 of 10.8 = 0.042) fails the check
    off = report.loss_check(_ok([10.80, 10.85, 10.78]), ref, gpu=True, source="plain")
    assert off["within"] is False and off["drift"] == pytest.approx(0.06)
    # fp32 on the CPU: 1e-4 relative
    assert report.loss_check(_ok([10.802, 10.79, 10.78]), ref, gpu=False, source="plain")["within"] is False
    assert report.loss_check({"status": "failed", "losses": []}, ref, gpu=True, source="plain")["within"] is None
    assert report.loss_check(_ok([10.8]), None, gpu=True, source="plain")["within"] is None


def test_loss_reference_is_plain_here_else_the_uncapped_ideal_run():
    uncapped = _ok([1.0])
    row = {"results": {"carina": _ok([1.0])}, "reference": uncapped}
    assert report._reference(row) == (uncapped, "plain PyTorch uncapped (the ideal's run)")
    row["results"]["plain"] = here = _ok([1.0])
    assert report._reference(row)[0] is here


def test_deepspeed_row_carries_the_preflight_failure(tmp_path, monkeypatch):
    import ds_preflight
    import systems

    reason = "cpu_adam failed (exit 1): fatal error: Python.h: No such file or directory"
    metrics = {"ops": {"cpu_adam": {"ok": False, "reason": reason}, "async_io": {"ok": True}}, "versions": {}}
    path = ds_preflight.write(metrics, tmp_path)
    monkeypatch.setenv("PEERS_DS_PREFLIGHT", str(path))
    res = systems.run(RunSpec(system="deepspeed_zero3_offload", device="cpu"))
    assert res.status == "unavailable" and res.reason.endswith(reason) and "cpu_adam" in res.reason


def test_deepspeed_config_follows_the_docs():
    from systems_deepspeed import ds_config

    spec = RunSpec(system="deepspeed_zero3_offload", shape="1b", tokens_per_step=8192, seq_len=2048)
    cfg = ds_config(spec, nvme=False)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["bf16"]["enabled"]
    assert zero["offload_param"] == zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["reduce_bucket_size"] == 2048 * 2048 and zero["stage3_param_persistence_threshold"] == 20480
    nvme = ds_config(RunSpec(system="deepspeed_zero_infinity", nvme_path="/nvme"), nvme=True)
    assert nvme["zero_optimization"]["offload_optimizer"]["device"] == "nvme"
    assert nvme["aio"]["queue_depth"] == 8 and nvme["aio"]["block_size"] == 1 << 20
    # DeepSpeed asserts when a parameter outgrows the NVMe param buffer: the 7B shape's embedding is 131M elements
    big = ds_config(RunSpec(system="deepspeed_zero_infinity", shape="7b", layers=16, nvme_path="/nvme"), nvme=True)
    assert big["zero_optimization"]["offload_param"]["buffer_size"] == 32000 * 4096
    assert nvme["zero_optimization"]["offload_param"]["buffer_size"] == int(1e8)
    # and its prefetcher may hold every free buffer: two layers' matrices, the embedding and the head (s14)
    assert big["zero_optimization"]["offload_param"]["buffer_count"] == 16


def test_config_names_carry_the_layer_cut():
    row = {"base": asdict(RunSpec(system="plain", shape="7b", layers=16, gpu_budget_gib=24.0)), "tokens": 8192}
    assert report._config_name(row) == "7b16l_8192tok_24g"


@pytest.mark.slow
def test_systems_past_the_budget_are_rows_with_the_reason(tmp_path):
    import subprocess

    cmd = [sys.executable, str(REPO / "benchmarks/offload/peers/harness.py"), "--preset", "ci", "--systems", "plain",
           "carina", "--budget", "1", "--tag", "t", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    [table] = load_records(tmp_path / "offload_peers_t_tiny_256tok_nocap_table.json")
    assert [(r["system"], r["status"]) for r in table["metrics"]["rows"]] == [
        ("plain", "not run"),
        ("carina", "not run"),
    ]
    assert all("budget" in r["reason"] for r in table["metrics"]["rows"])
    # one configuration per tagged run: the summary and plot are named after it
    stem = tmp_path / "offload_peers_t_tiny_256tok_nocap_"
    assert Path(f"{stem}summary.md").exists() and Path(f"{stem}plot.png").exists()


def test_preflight_keeps_the_compilers_own_words(tmp_path):
    import ds_preflight

    log = tmp_path / "build.log"
    log.write_text(
        "[1/3] c++ -MMD -c cpu_adam.cpp\n"
        "cpu_adam.cpp:1:10: fatal error: Python.h: No such file or directory\n"
        "ninja: build stopped: subcommand failed.\n"
        '{"ok": false, "reason": "cpu_adam: RuntimeError: Error building extension \'cpu_adam\'"}\n'
    )
    with log.open() as f:
        res = ds_preflight._parse("cpu_adam", 0, f)
    assert res["ok"] is False and res["reason"].startswith("cpu_adam: RuntimeError: Error building extension")
    assert "fatal error: Python.h: No such file or directory" in res["reason"]  # the row's reason says why
    assert any("Python.h: No such file" in line for line in res["log_tail"])
    log.write_text("Segmentation fault\n")
    with log.open() as f:
        res = ds_preflight._parse("async_io", -11, f)
    assert res["reason"] == "async_io failed (exit -11): Segmentation fault"
    assert ds_preflight.load(None) is None and ds_preflight.load(tmp_path / "absent.json") is None


def test_carina_takes_the_host_limit_as_given_on_the_cpu():
    from systems import _carina_host_budget

    spec = RunSpec(system="carina", host_budget_gib=0.5)
    # on the CPU the model is host memory too: the configuration's budget reaches carina as it is
    assert _carina_host_budget(spec, "cpu")["host_budget"] == 2**29
    assert _carina_host_budget(RunSpec(system="carina"), "cpu")["host_budget"] is None
