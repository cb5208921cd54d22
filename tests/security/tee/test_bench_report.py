"""Micro suite and workloads on the CPU at toy sizes; records, comparison and CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from carina.core.errors import ModelFormatError
from carina.security.tee.cli import app
from carina.security.tee.micro import MicroConfig, run_micro
from carina.security.tee.report import compare, load_record, render_compare_html, render_compare_png
from carina.security.tee.workloads import WorkloadConfig, run_workloads

runner = CliRunner()
TINY = {
    "models": ["bert-tiny", "granite-tiny"],
    "batches": [1, 2],
    "seq_lens": [8],
    "new_tokens": 4,
    "device": "cpu",
    "repeat": 1,
}


def test_micro_suite_labels_every_row() -> None:
    for mode in ("native", "emulated"):
        rows = run_micro(
            MicroConfig(device="cpu", mode=mode, sizes=[4096, 65536], repeat=2, small=10, aes_chunks=[4096])
        )
        benches = {r["bench"] for r in rows}
        assert {
            "h2d",
            "d2h",
            "copy_latency",
            "small_copies",
            "launch_latency",
            "alloc_1mib",
            "aes_gcm_encrypt",
        } <= benches
        transfer = [r for r in rows if r["bench"] in ("h2d", "d2h")]
        assert all(r["basis"] == ("emulated" if mode == "emulated" else "measured") for r in transfer)
        assert all(r["gbps"] > 0 and r["device"] == "cpu" for r in transfer)


def test_workloads_run_natively_and_emulated_with_identical_tokens() -> None:
    native = run_workloads(WorkloadConfig(mode="native", **TINY))
    emulated = run_workloads(WorkloadConfig(mode="emulated", **TINY))
    assert len(native) == len(emulated) == 2 * 2 * 2
    for a, b in zip(native, emulated, strict=True):
        assert (a["model"], a["batch"], a["pipelined"]) == (b["model"], b["batch"], b["pipelined"])
        assert b["basis"] == "emulated" and a["basis"] in ("measured", "modeled")
        if a["kind"] == "decoder":
            assert a["generated"] == b["generated"] and len(a["generated"]) == 4  # emulation delivers the true bytes
            assert a["ttft_s"] > 0 and a["itl_s"] > 0
        assert a["tokens_per_s"] > 0 and b["tokens_per_s"] > 0
        assert b["h2d_s"] > 0


def _fixture(name: str, scale: float, gbps: float, basis: str) -> dict:
    def row(b: int) -> dict:
        h2d, comp, d2h = 0.001 * scale * b, 0.008 * b * (1.125 if basis == "emulated" else 1.0), 0.001 * scale * b
        lat = h2d + comp + d2h
        return {
            "model": "m",
            "kind": "encoder",
            "batch": b,
            "seq": 8,
            "pipelined": False,
            "basis": basis,
            "h2d_s": h2d,
            "compute_s": comp,
            "d2h_s": d2h,
            "latency_s": lat,
            "tokens_per_s": 8 * b / lat,
        }

    memory = "pinned" if basis == "measured" else "bounce"
    micro = [
        {"bench": "h2d", "bytes": 1024, "memory": memory, "seconds": 1024 / gbps / 1e9, "gbps": gbps, "basis": basis}
    ]
    return {"name": name, "metrics": {"micro": micro, "workloads": [row(1), row(2)]}}


def test_compare_from_fixture_records(tmp_path: Path) -> None:
    result = compare(_fixture("native", 1.0, 20.0, "measured"), _fixture("cc", 1.5, 5.0, "emulated"))
    # shared compute (the smaller, 8 ms per batch item) + the emulated side's 1.5 ms transfers each way
    assert [round(r["latency_overhead"], 12) for r in result["workloads"]] == [0.1, 0.1]
    assert [round(r["latency_overhead_raw"], 12) for r in result["workloads"]] == [0.2, 0.2]
    assert result["transfers"][0]["slowdown"] == pytest.approx(4.0)
    assert render_compare_png(result, tmp_path / "o.png")[:4] == b"\x89PNG"
    page = render_compare_html(result)
    assert "latency_overhead" in page and "data:image/png" in page


def test_load_record_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ModelFormatError):
        load_record(bad)
    bad.write_text(json.dumps({"metrics": {}}))
    with pytest.raises(ModelFormatError, match=r"metrics\.workloads"):
        load_record(bad)


def test_cli_bench_and_compare(tmp_path: Path) -> None:
    common = [
        "--device",
        "cpu",
        "--models",
        "bert-tiny,llama-tiny",
        "--batches",
        "1,2",
        "--seq",
        "8",
        "--new-tokens",
        "2",
    ]
    common += ["--sizes", "4096", "--repeat", "1", "--out", str(tmp_path)]
    for mode in ("native", "emulated"):
        res = runner.invoke(app, ["bench", "--mode", mode, *common, "--json"])
        assert res.exit_code == 0, res.output
    records = sorted(tmp_path.glob("security_tee_*.json"))
    assert [p.name for p in records] == ["security_tee_emulated_cpu.json", "security_tee_native_cpu.json"]
    emulated = json.loads(records[0].read_text())
    assert emulated["metrics"]["assumptions"]["gpu_crypto_gbps"] > 0
    assert all(f["basis"] == "emulated" for f in emulated["figures"])
    assert emulated["metrics"]["detect"]["emulated"] is False  # detection is real, never faked
    res = runner.invoke(
        app,
        [
            "compare",
            str(records[1]),
            str(records[0]),
            "--png",
            str(tmp_path / "c.png"),
            "--html",
            str(tmp_path / "c.html"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["workloads"]) == 2 * 2 * 2 and (tmp_path / "c.png").stat().st_size > 1000
    res = runner.invoke(app, ["detect", "--json"])
    assert json.loads(res.stdout)["emulated"] is False
