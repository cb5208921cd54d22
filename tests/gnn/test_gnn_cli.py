import json

import pytest
from typer.testing import CliRunner

from carina.core.errors import ConfigError
from carina.gnn.cli import app

runner = CliRunner()


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_prepare_train_calibrate_plan(tmp_path):
    ds = tmp_path / "ds"
    info = _json(
        runner.invoke(
            app,
            [
                "prepare",
                str(ds),
                "--nodes",
                "2048",
                "--dim",
                "32",
                "--train-fraction",
                "0.1",
                "--avg-degree",
                "6",
                "--json",
            ],
        )
    )
    assert info["num_nodes"] == 2048 and info["row_stride"] == 128
    rep = _json(
        runner.invoke(
            app,
            [
                "train",
                str(ds),
                "--fanouts",
                "5,5",
                "--batch-size",
                "64",
                "--hidden",
                "16",
                "--max-batches",
                "3",
                "--host-gather",
                "device",
                "--json",
            ],
        )
    )
    assert rep["losses_equal"] is True and rep["out_of_core"]["batches"] == 3
    machine = tmp_path / "m.json"
    spec = _json(runner.invoke(app, ["calibrate", str(tmp_path), "--size-mb", "8", "--out", str(machine), "--json"]))
    assert spec["ssd_iops"] > 0 and machine.is_file()
    # a CPU reads its host slice itself: the device path's rate is the host gather's; the disk-form probe is kept
    assert spec["uva_gbps"] == spec["host_gather_gbps"] > 0 and spec["uva_row_ns"] == 0
    assert spec["disk_probe_pages"] >= 2 and spec["disk_probe_us"] > 0
    plan = _json(
        runner.invoke(
            app,
            [
                "plan",
                str(ds),
                "--machine",
                str(machine),
                "--fanouts",
                "5,5",
                "--batch-size",
                "64",
                "--hidden",
                "16",
                "--max-ssds",
                "2",
                "--json",
            ],
        )
    )
    assert plan["best"]["bottleneck"] in {"sample", "disk", "compute"}
    table = runner.invoke(app, ["train", str(ds), "--fanouts", "5,5", "--batch-size", "64", "--max-batches", "2"])
    assert table.exit_code == 0 and "losses equal to in-memory" in table.stdout


def test_bad_fanouts_are_a_config_error(tmp_path):
    result = runner.invoke(app, ["train", str(tmp_path), "--fanouts", "a,b"])
    assert isinstance(result.exception, ConfigError) and result.exception.context["key"] == "fanouts"


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["train", ".", "--model", "gat"], "model"),
        (["train", ".", "--compare", "mmap"], "compare"),
        (["train", ".", "--hotness", "random"], "hotness"),
        (["train", ".", "--host-gather", "gpu"], "host_gather"),
        (["prepare", "out", "--generator", "er"], "generator"),
        (["topo", "--topology", "no-such-machine"], "topology"),
    ],
)
def test_bad_choices_are_config_errors_naming_the_key(tmp_path, args, key):
    result = runner.invoke(app, [str(tmp_path / a) if a in (".", "out") else a for a in args])
    assert isinstance(result.exception, ConfigError), result.output
    assert result.exception.context["key"] == key


def test_topo_and_place(tmp_path):
    topo = _json(runner.invoke(app, ["topo", "--topology", "nvswitch-8gpu", "--json"]))
    assert topo["simulated"] is True and len(topo["nodes"]) == 25
    path = tmp_path / "t.json"
    path.write_text(json.dumps(topo))
    again = _json(runner.invoke(app, ["topo", "--topology", str(path), "--json"]))
    assert again == topo
    res = _json(runner.invoke(app, ["place", "--topology", "pcie-8gpu-2socket", "--items", "48", "--json"]))
    assert set(res["placements"]) == {"carina-greedy", "replicate-hottest"}
    table = runner.invoke(app, ["place", "--topology", "nvswitch-8gpu", "--items", "32"])
    assert table.exit_code == 0 and "simulated" in table.stdout
    routed = runner.invoke(app, ["place", "--topology", "nvswitch-8gpu", "--items", "32", "--routes"])
    assert routed.exit_code == 0 and "LP load per link" in routed.stdout and "nvswitch->gpu0" in routed.stdout
    bad = runner.invoke(app, ["topo", "--topology", "no-such-machine"])
    assert bad.exit_code != 0


def test_plan_from_a_workload_file(tmp_path):
    from carina.gnn.costmodel import MachineSpec, WorkloadProfile

    m = tmp_path / "m.json"
    MachineSpec(ssd_read_gbps=1.5, ssd_iops=13_000.0).save(m)
    w = tmp_path / "w.json"
    WorkloadProfile(
        num_nodes=1 << 20,
        row_bytes=512,
        row_stride=512,
        batch_size=1024,
        batches_per_epoch=10,
        unique_per_batch=15_000.0,
        sample_s=0.02,
        compute_s=0.003,
        hotness_curve=[0.0, 0.5, 1.0],
    ).save(w)
    args = ["plan", "--machine", str(m), "--workload", str(w), "--gpu-mem-gb", "8.1", "--host-mem-gb", "16.2"]
    res = _json(runner.invoke(app, [*args, "--max-ssds", "4", "--json"]))
    assert len(res["candidates"]) == 4 and res["best"]["bottleneck"] in {"disk", "sample"}
    assert res["best"]["stages"]["lookup"] == 0  # a machine file without lookup rates (before session 13)
    text = runner.invoke(app, [*args, "--max-ssds", "4"])
    assert text.exit_code == 0 and "lookup priced at 0" in text.output
    assert runner.invoke(app, ["plan"]).exit_code != 0


def test_unknown_device_is_a_config_error():
    from carina.gnn.runner import RunConfig

    assert RunConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ConfigError) as info:
        RunConfig(device="tpu")
    assert info.value.context["key"] == "device"
