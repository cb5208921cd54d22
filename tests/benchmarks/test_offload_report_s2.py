"""The S2 report prices the ideal at the ideal's own micro-batch size, whatever split carina ran."""

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "offload"))

import report_s2  # noqa: E402

#: Two truncations: 0.1 s + 0.02 s/layer per 4-sequence micro-batch, 1e-11 s/param of GPU AdamW.
IDEAL = {
    "rates": {"cpu_adamw_params_per_s": 4e9, "h2d_gbps": 50.0, "d2h_gbps": 50.0},
    "4": {"params": 1_000_000_000, "fb_s": [0.18, 0.18, 0.18], "opt_s": [0.01] * 3},
    "8": {"params": 2_000_000_000, "fb_s": [0.26, 0.26, 0.26], "opt_s": [0.02] * 3},
}


def _run(tokens: int, accum: int, step_s: float) -> dict:
    host = {"process_rss_peak_sampled": 60e9, "process_rss_peak": 61e9, "machine_used_peak": 62e9}
    return {"tokens": tokens, "accum": accum, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "params": 3_000_000_000, "layers": 16, "host": host,
            "moved_per_step": {"host->device": 20e9, "device->host": 10e9},
            "plan": {"bytes": {"host": 50e9}, "predicted_s": {"step": step_s}}}  # fmt: skip


def _args(work: Path, out: Path, **kw: object) -> Namespace:
    base = dict(work=str(work), out=str(out), model="llama2-7b", layers=16, seq=2048, micro=4, cap=24.0,
                host_budget=110.0, tag="t", report_tokens=[8192, 32768], tokens=8192, spill_tag="s",
                environment_from="")  # fmt: skip
    return Namespace(**{**base, **kw})


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    (tmp_path / "ideal.json").write_text(json.dumps(IDEAL))
    (tmp_path / "carina_8192.json").write_text(json.dumps(_run(8192, 1, 1.0)))
    # 32k run as ONE micro-batch of 16 sequences: carina's accum is 1, the ideal's micro-batches are 4
    (tmp_path / "carina_32768.json").write_text(json.dumps(_run(32768, 1, 2.0)))
    return tmp_path


def _record(out: Path, label: str) -> dict:
    return json.loads((out / f"offload_s2_t_{label}.json").read_text())


def test_the_ideal_counts_its_own_micro_batches_not_carinas_split(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report_s2.report(_args(work, out))
    per_micro = 0.1 + 0.02 * 16  # a + b * layers
    opt = 1e-11 * 3_000_000_000
    r8, r32 = _record(out, "8k"), _record(out, "32k")
    assert r8["metrics"]["ideal_step_s"] == pytest.approx(per_micro + opt)
    assert r32["metrics"]["ideal_step_s"] == pytest.approx(4 * per_micro + opt)
    assert r32["metrics"]["fraction_of_ideal"] == pytest.approx((4 * per_micro + opt) / 2.0)
    assert r32["config"]["micro_batch_sequences"] == 16 and r32["config"]["ideal_micro_batch_sequences"] == 4
    assert r8["config"]["micro_batch_sequences"] == 4


def test_a_recomputed_report_keeps_the_measuring_machine(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report_s2.report(_args(work, out))
    device = _record(out, "8k")
    device["environment"]["torch"] = {"gpus": [{"name": "NVIDIA H200"}], "cuda_available": True}
    device["name"], device["git_sha"] = "offload_s2_t_8k", "a" * 40
    src = tmp_path / "device.json"
    src.write_text(json.dumps(device))
    again = tmp_path / "again"
    report_s2.report(_args(work, again, environment_from=str(src)))
    rec = _record(again, "32k")
    assert rec["environment"]["torch"]["gpus"][0]["name"] == "NVIDIA H200"
    assert rec["machine"]["label"] == "h200"
    assert rec["metrics"]["recomputed_from"]["git_sha"] == "a" * 40


def test_an_ideal_from_an_earlier_run_is_named_as_such(work: Path, tmp_path: Path) -> None:
    earlier = tmp_path / "earlier_ideal.json"
    earlier.write_text((work / "ideal.json").read_text())
    (work / "ideal.json").unlink()
    out = tmp_path / "out"
    report_s2.report(_args(work, out, ideal_from=str(earlier), ideal_source="session 6's ideal phase"))
    fig = _record(out, "32k")["figures"][0]
    assert "in an earlier run (session 6's ideal phase), NOT in this run" in fig["ceiling_source"]
    assert fig["ceiling"] == pytest.approx(32768 / (4 * (0.1 + 0.02 * 16) + 1e-11 * 3_000_000_000))
    report_s2.report(_args(work, tmp_path / "none"))  # no ideal at all: no ceiling, no claim about a run
    assert _record(tmp_path / "none", "32k")["figures"][0]["ceiling"] is None


def test_host_memory_term_counts_adamw_and_every_moved_byte() -> None:
    run = _run(8192, 1, 1.0)
    assert report_s2.host_memory_term(run) is None  # no probed bandwidth: no term
    run["hardware"] = {"host_mem": 100e9}
    assert report_s2.host_memory_term(run) == (28 * 3_000_000_000 + 30e9) / 100e9


def test_disk_mixed_term_prices_both_directions_at_the_mixed_rate() -> None:
    run = _run(8192, 1, 60.0)
    assert report_s2.disk_mixed_term(run) is None  # no spill probe: no term
    run["disk"] = {"write_gbps": 2.3, "read_gbps": 1.55}
    assert report_s2.disk_mixed_term(run) is None  # a session-8 probe had no mixed rate
    run["disk"]["mixed_gbps"] = 1.5
    run["moved_per_step"].update({"host->nvme": 45e9, "nvme->host": 48e9})
    assert report_s2.disk_mixed_term(run) == pytest.approx(93e9 / 1.5e9)
    assert report_s2.roofline(run, IDEAL["rates"], 0.5)["disk"] == pytest.approx(45 / 2.3 + 48 / 1.55)


def test_disk_probe_measures_write_read_and_mixed_through_the_nvme_tier(tmp_path: Path) -> None:
    import bench_s2

    rates = bench_s2.disk_rates(str(tmp_path), nbytes=8 << 20, pieces=4, rounds=1)
    assert {"write_gbps", "read_gbps", "mixed_gbps"} <= rates.keys()
    assert all(rates[k] > 0 for k in ("write_gbps", "read_gbps", "mixed_gbps"))
    assert (rates["bytes"], rates["pieces"]) == (8 << 20, 4)
