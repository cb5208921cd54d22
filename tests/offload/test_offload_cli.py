"""``carina train`` and ``carina offload`` through the root CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from carina.cli.app import app

runner = CliRunner()


def test_train_json_on_a_tiny_model_stays_within_budget():
    res = runner.invoke(
        app,
        ["train", "--model", "tiny", "--steps", "4", "--seq-len", "32", "--device", "cpu",
         "--device-budget", "1500KiB", "--lr", "0.01", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    result = out["result"]
    assert out["config"]["offload"]["device_budget"] == 1500 << 10
    assert len(result["losses"]) == 4 and result["losses"][-1] < result["losses"][0]
    assert result["within_budget"] is True
    assert result["memory"]["device"]["peak"] <= 1500 << 10
    # weights, gradients and AdamW state (16 B/param) are about twice the device budget
    assert result["params"] * 16 > 1.8 * result["memory"]["device"]["budget"]
    assert result["plan"]["blocks"]["streamed"] >= 1
    assert result["moved_per_step"]["host->device"] > 0


def test_train_reports_capacity_error_with_exit_status_2():
    res = runner.invoke(app, ["train", "--model", "tiny", "--device", "cpu", "--device-budget", "100KiB", "--json"])
    assert res.exit_code == 2
    assert "device budget" in res.output and "at least" in res.output


def test_train_rejects_bad_sizes_and_configs(tmp_path):
    res = runner.invoke(app, ["train", "--model", "tiny", "--device-budget", "lots", "--json"])
    assert res.exit_code == 2 and "not a size" in res.output
    bad = tmp_path / "train.toml"
    bad.write_text("steps = 3\nwarp = 9\n")
    res = runner.invoke(app, ["train", "--config", str(bad), "--json"])
    assert res.exit_code == 2 and "warp" in res.output


def test_offload_plan_for_7b_in_24gb_and_what_does_not_fit():
    res = runner.invoke(app, ["offload", "plan", "--model", "llama2-7b", "--tokens", "8192", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["basis"] == "modeled" and plan["params"] == 6_738_415_616
    assert plan["bytes"]["device_peak"] <= 24 << 30
    assert plan["bottleneck"] in {"compute", "h2d", "d2h", "cpu_optimizer", "disk", "host_memory"}
    # host memory: by default the least the optimizer rate implies (2 Gparam/s x 28 B), or as given, or off
    assert plan["host_memory"]["bandwidth_bytes_per_s"] == 2e9 * 28
    assert plan["predicted_s"]["host_memory"] == plan["host_memory"]["traffic_bytes_per_step"] / (2e9 * 28)
    args = ["offload", "plan", "--model", "llama2-7b", "--tokens", "8192"]
    given = json.loads(runner.invoke(app, [*args, "--host-mem-gbps", "300", "--json"]).stdout)
    off = json.loads(runner.invoke(app, [*args, "--host-mem-gbps", "-1", "--json"]).stdout)
    assert given["host_memory"]["bandwidth_bytes_per_s"] == 300e9 and off["predicted_s"]["host_memory"] == 0.0
    assert off["predicted_s"]["step"] <= plan["predicted_s"]["step"]
    text = runner.invoke(app, [*args, "--host-mem-gbps", "300"]).stdout
    assert "host memory traffic" in text and "300.0 GB/s" in text
    res = runner.invoke(app, ["offload", "plan", "--model", "llama2-7b", "--host-budget", "64GB", "--json"])
    assert res.exit_code == 2 and "host budget" in res.output
    res = runner.invoke(
        app, ["offload", "plan", "--model", "llama2-7b", "--host-budget", "100GB", "--nvme-budget", "1TB", "--json"]
    )
    assert res.exit_code == 0
    assert json.loads(res.stdout)["blocks"]["state_on_nvme"] > 0


def test_offload_plan_with_micro_batches_plans_device_accumulators():
    base = ["offload", "plan", "--model", "llama-1b", "--device-budget", "7.6GiB", "--h2d-gbps", "54.5",
            "--d2h-gbps", "54.6", "--optim-gparams", "2.2", "--json"]  # fmt: skip
    one = json.loads(runner.invoke(app, base).stdout)
    four = json.loads(runner.invoke(app, [*base, "--micro-batches", "4"]).stdout)
    assert one["blocks"]["grad_on_device"] == 0 and four["blocks"]["grad_on_device"] > 0
    assert four["bytes"]["device_peak"] <= int(7.6 * (1 << 30))
    # four micro-batches: four forward+backward passes of compute, the optimizer once
    assert four["predicted_s"]["compute"] > 3.5 * one["predicted_s"]["compute"]
    assert runner.invoke(app, [*base, "--micro-batches", "0"]).exit_code == 2


def test_presets_listed():
    res = runner.invoke(app, ["offload", "presets", "--json"])
    assert res.exit_code == 0
    names = [row["name"] for row in json.loads(res.stdout)]
    assert {"tiny", "demo", "llama2-7b"} <= set(names)
