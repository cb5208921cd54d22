"""The GPU-vs-CPU-tier figure of benchmarks/infra_storage/bench_engines.py compares on no more cores."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "infra_storage"))

import bench_engines  # noqa: E402


def _row(system: str, engine: str, codec: str, mb_s: float, cpu: float) -> dict:
    rates = {f"{op}_{k}": v for op in ("compress", "decompress") for k, v in (("mb_s", mb_s), ("cpu_s_per_gb", cpu))}
    return {"system": system, "engine": engine, "codec": codec, "block": 65536, "round": 0, **rates}


def test_gpu_engine_is_compared_with_the_best_cpu_tier_on_no_more_cores() -> None:
    rows = [
        _row("torch-cudax4", "torch", "zvc", 2000.0, 0.9),  # 2000 MB/s x 0.9 s/GB = 1.8 cores -> 2
        _row("torch-cudax1", "torch", "zvc", 1000.0, 1.0),
        _row("inline", "inline", "zvc", 50.0, 20.0),  # the same codec on the CPU is no CPU-tier baseline
        _row("inline", "inline", "zlib", 100.0, 10.0),
        _row("threadx2", "thread", "zlib", 180.0, 11.0),
        _row("threadx4", "thread", "zlib", 350.0, 11.0),  # needs 4 cores: more than the GPU engine used
    ]
    figs = {f.name: f for f in bench_engines.gpu_vs_cpu_tier(rows, {"h2d_gb_s": 50.0, "d2h_gb_s": 40.0})}
    comp = figs["gpu_vs_cpu_tier_zlib_64k_compress"]
    assert comp.value == pytest.approx(2000 / 180)
    assert comp.ceiling == pytest.approx(50_000 / 180)  # PCIe over the same baseline
    assert comp.peers["gpu host cores"] == 2 and comp.peers["threadx2 (zlib) MB/s"] == 180
    assert figs["gpu_vs_cpu_tier_zlib_64k_decompress"].ceiling == pytest.approx(40_000 / 180)
    assert not bench_engines.gpu_vs_cpu_tier([r for r in rows if r["engine"] != "torch"], {})
