"""The peer harness's loss reference, weights, earlier-record rows and the 3B correctness-check preset."""

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "offload" / "peers"))

import ds_preflight  # noqa: E402
import earlier  # noqa: E402
import harness  # noqa: E402
import report  # noqa: E402
import systems  # noqa: E402
import workload  # noqa: E402
from presets import PRESETS, base_spec  # noqa: E402
from workload import RunSpec  # noqa: E402

from carina.core.errors import ConfigError  # noqa: E402

TINY = RunSpec(system="plain", shape="tiny", tokens_per_step=128, seq_len=32, steps=2, warmup=1, device="cpu")


def test_cached_weights_are_the_built_model_bitwise(tmp_path, monkeypatch):
    import torch

    built = workload.build_model(TINY)
    monkeypatch.setenv("PEERS_WEIGHTS_DIR", str(tmp_path))
    saved = workload.build_model(TINY)  # builds and saves
    [path] = tmp_path.iterdir()
    assert path.name == "tiny_2l_v32000_pos128_seed0" and (path / "manifest.json").exists()
    loaded = workload.build_model(TINY, checkpointing=True)  # maps the file
    want, got = workload._tensors(built), workload._tensors(loaded)
    assert set(want) == set(got) and any("rotary" in name for name in got)  # non-persistent buffers too
    assert all(torch.equal(want[k], got[k]) and not got[k].is_meta for k in want)
    # each tensor maps its own file: freeing one gives its memory back, as with the built model
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in got.values())
    assert all(p.requires_grad for p in loaded.parameters())
    assert any(getattr(m, "gradient_checkpointing", False) for m in loaded.modules())
    assert workload._tensors(saved).keys() == want.keys()
    other = replace(TINY, layers=1)  # another shape: another file, never the cached one
    assert workload._weights_file(other) != path
    workload._save_model(torch.nn.Linear(1, 1), workload._weights_file(other))  # another model's tensors
    with pytest.raises(ConfigError, match="holds other tensors than the tiny model"):
        workload.build_model(other)


def test_checkpointed_plain_has_plain_losses():
    plain = systems.run(TINY)
    ckpt = systems.run(replace(TINY, system="plain_checkpointed"))
    assert plain.status == ckpt.status == "ok", (plain.reason, ckpt.reason)
    assert ckpt.settings["activation_checkpointing"] and "activation_checkpointing" not in plain.settings
    check = report.loss_check(asdict(ckpt), asdict(plain), gpu=False, source="plain")
    assert check["within"] is True and check["max_abs_diff"] < 1e-5 and check["steps"] == 3
    assert check["reference_losses"] == plain.losses  # the record holds what it was compared with
    assert plain.losses[0] != plain.losses[-1]  # the reference moved: the check compared trained steps


def test_the_reference_is_checkpointed_plain_where_plain_does_not_fit(monkeypatch):
    base = replace(TINY, shape="7b", layers=16, tokens_per_step=32768, seq_len=2048, device="auto")
    calls = []

    def fake_run_one(spec, timeout, cache=True):  # plain uncapped out of memory at 16 layers, as at 32k on the H200
        calls.append((spec.system, spec.layers, cache))
        if spec.system == "plain" and spec.layers == 16:
            return {"spec": asdict(spec), "status": "failed", "reason": "out of memory; fp32 weights ..."}
        tps = {"plain_checkpointed": 100.0, 4: 400.0, 8: 200.0}[spec.system if spec.layers == 16 else spec.layers]
        return {"spec": asdict(spec), "status": "ok", "tokens_per_s": tps, "losses": [11.0, 10.9]}

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    ideal_s, how, reference, ref_how = harness.ideal_step_s(base, timeout=10)
    # the truncations' weights are used once: not cached
    assert calls == [("plain", 16, True), ("plain_checkpointed", 16, True), ("plain", 4, False), ("plain", 8, False)]
    assert reference["spec"]["system"] == "plain_checkpointed" and ref_how == report.REFERENCE_CHECKPOINTED
    assert reference["spec"]["gpu_budget_gib"] is None  # uncapped, as the ideal
    assert ideal_s == pytest.approx(32768 / 400 + (32768 / 200 - 32768 / 400) / 4 * 12)  # never the reference's
    assert how.startswith("extrapolated from 4/8-layer truncations")
    row = {"results": {}, "reference": reference, "reference_how": ref_how}
    assert report._reference(row) == (reference, report.REFERENCE_CHECKPOINTED)


def _failed_record(tmp_path, spec: dict, status: str = "failed") -> str:
    rel = "h200/offload_peers_old_x.json"
    (tmp_path / "h200").mkdir(exist_ok=True)
    metrics = {"status": status, "reason": "out of memory; fp32 weights take 13.0 GiB", "versions": {"torch": "2.11"}}
    rec = {"config": spec, "metrics": metrics, "git_sha": "d079959e82d0"}
    (tmp_path / rel).write_text(json.dumps(rec))
    return rel


def test_a_system_that_failed_here_in_a_named_record_is_not_run_again(tmp_path):
    spec = asdict(replace(base_spec(PRESETS["h200-7b16l"], 8192, None), system="torchao_cpu_offload"))
    rel = _failed_record(tmp_path, spec)
    row = earlier.known_row(spec, rel, results=tmp_path)
    assert row is not None and row["status"] == "not run" and row["earlier_record"] == rel
    assert row["reason"] == (
        f"not run again: failed at this configuration in {rel} (commit d079959e82, torch 2.11): "
        "out of memory; fp32 weights take 13.0 GiB"
    )
    for other in ({"gpu_budget_gib": 32.0}, {"tokens_per_step": 32768}, {"micro_batches": 2}, {"system": "carina"}):
        assert earlier.known_row(spec | other, rel, results=tmp_path) is None, other  # another configuration: run
    _failed_record(tmp_path, spec, status="ok")
    assert earlier.known_row(spec, rel, results=tmp_path) is None  # it ran: run it again
    assert earlier.known_row(spec, "h200/absent.json", results=tmp_path) is None


def test_the_8k_presets_torchao_rows_come_from_session_5s_records():
    preset = PRESETS["h200-7b16l"]
    base = base_spec(preset, 8192, None)
    for system, rel in preset["known"].items():
        row = earlier.known_row(asdict(replace(base, system=system)), rel)
        assert row is not None and "out of memory" in row["reason"] and rel in row["reason"], system
    spec32 = replace(base_spec(PRESETS["h200-7b16l-32k"], 32768, None), system="torchao_cpu_offload_grads")
    assert earlier.known_row(asdict(spec32), PRESETS["h200-7b16l-32k"]["known"][spec32.system]) is not None


def test_rows_known_without_running_match_run(tmp_path):
    accum = replace(base_spec(PRESETS["ci-accum"], 256, None), system="torchao_cpu_offload_grads", device="cpu")
    spill = replace(base_spec(PRESETS["h200-7b16l-spill"], 8192, str(tmp_path)), system="fsdp2_cpu_offload")
    for spec in (accum, spill):
        static, ran = systems.static_result(spec), systems.run(spec)
        assert static is not None and (static.status, static.reason) == (ran.status, ran.reason)
        free = [r.settings.pop("nvme", {}).pop("disk_free_bytes_before", None) for r in (static, ran)]
        assert static.settings == ran.settings and (free[0] is None) == (spec.nvme_path is None)
    assert systems.static_result(replace(accum, system="carina")) is None


def test_the_3b_check_gives_torchao_its_own_cap_and_records_it():
    preset = PRESETS["h200-3b-check"]
    base = base_spec(preset, 4096, None)
    assert workload.n_params(base) == pytest.approx(3.43e9, rel=0.01) and base.gpu_budget_gib == 12.0
    assert harness._system_spec(base, "torchao_cpu_offload", preset).gpu_budget_gib is None
    assert harness._system_spec(base, "carina", preset).gpu_budget_gib == 12.0
    assert set(preset["systems"]) == {*systems.SYSTEMS} - {"plain", "plain_checkpointed", "deepspeed_zero_infinity",
                                                            "torchao_cpu_offload_grads"}  # fmt: skip
    spec = harness._system_spec(base, "torchao_cpu_offload", preset)
    result = {"spec": asdict(spec), "status": "failed", "reason": "x"}
    row = {"tokens": 4096, "tag": "t", "base": asdict(base), "ideal_s": None, "ideal_how": "", "roofline_s": None,
           "reference": None, "results": {"torchao_cpu_offload": result}}  # fmt: skip
    [rec, table] = report.records([row], {}, "cmd")
    assert rec["config"]["gpu_budget_gib"] is None and table["config"]["gpu_budget_gib"] == 12.0
    assert rec["name"] == "offload_peers_t_3b_4096tok_12g_torchao_cpu_offload"


def test_the_libaio_probe_says_why_it_fails(monkeypatch):
    monkeypatch.setenv("CC", "carina-no-such-cc")
    probe = ds_preflight._probe_libaio()
    assert probe["CC"] == "carina-no-such-cc" and probe["compile"].startswith("carina-no-such-cc ")
    assert probe["outcome"].startswith("compile: FileNotFoundError") and "carina-no-such-cc" in probe["outcome"]
