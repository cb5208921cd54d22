"""The peer harness's gradient accumulation and spill configuration: same data, same losses, split recorded."""

import socket
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "offload" / "peers"))

import harness  # noqa: E402
import report  # noqa: E402
import systems  # noqa: E402
from presets import PRESETS, base_spec  # noqa: E402
from systems_deepspeed import ds_config  # noqa: E402
from workload import RunSpec, batches, n_params, timed_loop  # noqa: E402

from carina.core.errors import ConfigError  # noqa: E402


def _ci_accum(system: str) -> RunSpec:
    spec = base_spec(PRESETS["ci-accum"], 256, None)
    return replace(spec, system=system, device="cpu", steps=2, warmup=1)


@pytest.fixture(scope="module")
def plain_accum():
    res = systems.run(_ci_accum("plain"))
    assert res.status == "ok", res.reason
    return res


def test_a_steps_tokens_do_not_depend_on_its_split():
    import torch

    one = batches(RunSpec(system="plain", tokens_per_step=256, seq_len=64, steps=2, warmup=1))
    four = batches(RunSpec(system="plain", tokens_per_step=256, seq_len=64, steps=2, warmup=1, micro_batches=4))
    assert [len(s) for s in one] == [1, 1, 1] and [len(s) for s in four] == [4, 4, 4]
    for whole, parts in zip(one, four, strict=True):
        assert [tuple(p.shape) for p in parts] == [(1, 64)] * 4
        assert torch.equal(whole[0], torch.cat(parts))
    with pytest.raises(ConfigError, match="micro_batches=3 must be >= 1 and divide the step's 4 sequences"):
        RunSpec(system="plain", tokens_per_step=256, seq_len=64, micro_batches=3)


def test_the_presets_split_reaches_each_systems_settings(tmp_path, monkeypatch):
    import ds_preflight

    # DeepSpeed's row without training (a failed preflight), so that the test is fast where DeepSpeed is installed
    failed = {"ops": {"cpu_adam": {"ok": False, "reason": "not built here"}}, "versions": {}}
    monkeypatch.setenv("PEERS_DS_PREFLIGHT", str(ds_preflight.write(failed, tmp_path)))
    spec = base_spec(PRESETS["h200-7b16l-128k"], 131072, None)
    assert (spec.micro_batches, spec.layers, spec.gpu_budget_gib) == (8, 16, 24.0)
    for nvme in (False, True):
        cfg = ds_config(replace(spec, nvme_path="/nvme"), nvme=nvme)
        assert (cfg["gradient_accumulation_steps"], cfg["train_micro_batch_size_per_gpu"]) == (8, 8)
    assert base_spec(PRESETS["h200-7b16l-32k"], 32768, None).micro_batches == 1
    # every system's record says the split, whether it ran or not (CPU: FSDP2 and torchao need CUDA,
    # torchao with offload_gradients cannot accumulate)
    want = {"micro_batches": 2, "sequences_per_micro_batch": 2, "tokens_per_micro_batch": 128}
    for system in PRESETS["ci-accum"]["systems"]:
        if system in ("plain", "carina"):
            continue  # run below, with their losses
        res = systems.run(_ci_accum(system))
        split = res.settings["gradient_accumulation"]
        assert {k: split[k] for k in want} == want and split["how"] == systems.ACCUMULATION[system], system
    grads = systems.run(_ci_accum("torchao_cpu_offload_grads"))
    assert grads.status == "unavailable" and "not compatible with gradient accumulation" in grads.reason


def test_carina_accumulates_bitwise_as_plain(plain_accum):
    res = systems.run(_ci_accum("carina"))
    assert res.status == "ok", res.reason
    assert res.settings["config"]["grad_accumulation"] == 2
    assert res.settings["gradient_accumulation"]["micro_batches"] == 2
    assert res.losses == plain_accum.losses  # fp32 on the CPU: carina promises bitwise
    # a step's loss is the mean of its micro-batches': not the one-batch loss of the same tokens
    whole = systems.run(replace(_ci_accum("plain"), micro_batches=1))
    assert whole.losses[0] == pytest.approx(plain_accum.losses[0], rel=1e-3) and whole.losses != plain_accum.losses


@pytest.mark.slow
def test_fsdp2_accumulation_matches_plain(plain_accum, monkeypatch):
    """The harness's FSDP2 wrapping and loop, on a gloo CPU mesh (CPUOffloadPolicy needs CUDA), fp32."""
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    spec = _ci_accum("fsdp2_cpu_offload")
    try:
        model = systems.fsdp2_model(spec, "cpu", offload=False)
        opt = torch.optim.AdamW(model.parameters(), **systems.OPTIM)
        res = timed_loop(spec, systems._hf_step(model, opt, "cpu"), "cpu")
    finally:
        dist.destroy_process_group()
    check = report.loss_check(asdict(res), asdict(plain_accum), gpu=False, source="plain")
    assert check["within"] is True and check["steps"] == 3, check
    assert plain_accum.losses[0] - plain_accum.losses[-1] != 0  # the reference moved: the check compared steps


def test_spill_peers_without_nvme_are_rows_with_the_reason(tmp_path):
    spec = base_spec(PRESETS["h200-7b16l-spill"], 8192, str(tmp_path))
    need = 16 * n_params(spec) / 2**30
    assert spec.host_budget_gib < 12 * n_params(spec) / 2**30 < need  # under the optimizer state
    for system in ("deepspeed_zero3_offload", "fsdp2_cpu_offload", "torchao_cpu_offload"):
        res = systems.run(replace(spec, system=system))
        assert res.status == "unavailable" and res.reason.startswith("no NVMe tier"), system
        assert "16 B x 3.5B parameters = 52.2 GiB of host memory" in res.reason, res.reason
        assert "over the 36 GiB host budget" in res.reason and need == pytest.approx(52.2, abs=0.05)
        assert res.settings["host_budget_gib"] == 36.0 and res.settings["nvme"]["disk_free_bytes_before"] > 0
    assert (
        ds_config(replace(spec, system="deepspeed_zero_infinity"), nvme=True)["zero_optimization"]["offload_param"][
            "device"
        ]
        == "nvme"
    )


@pytest.mark.slow
def test_carina_spills_under_the_host_budget_and_matches_plain(tmp_path):
    spec = replace(base_spec(PRESETS["ci-spill"], 256, str(tmp_path)), device="cpu", steps=1, warmup=3)
    plain = asdict(systems.run(replace(spec, system="plain", nvme_path=None, host_budget_gib=None)))
    carina = harness._run_system(replace(spec, system="carina"), timeout=300)  # its own process and folder
    assert carina["status"] == "ok", carina["reason"]
    assert carina["settings"]["config"]["host_budget"] == int(spec.host_budget_gib * 2**30)
    assert carina["settings"]["plan"]["blocks"]["state_on_nvme"] > 0  # the budget is under the optimizer state
    assert carina["losses"] == plain["losses"]  # bitwise with the spill on
    assert list(tmp_path.iterdir()) == []  # each system's spill folder is removed after it
    row = {"base": asdict(spec), "tokens": 256, "tag": "t"}
    assert report._config_name(row) == "t_small_256tok_nocap_host0.009g"
    row["base"]["micro_batches"] = 2
    assert report._config_name(row) == "t_small_256tok_2micro_nocap_host0.009g"
    assert report.host_check(carina, spec.host_budget_gib)["budget_bytes"] == int(0.009 * 2**30)
