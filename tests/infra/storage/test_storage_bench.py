from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from carina.core.errors import ConfigError
from carina.infra.storage.bench_record import figures_from
from carina.infra.storage.config import CodecName
from carina.infra.storage.loadtest import BenchConfig, codec_throughput, make_dataset, split_system


def test_dataset_is_a_real_ext4_image_that_compresses(tmp_path: Path) -> None:
    image = make_dataset(tmp_path / "d.ext4", 16 << 20)
    assert image.stat().st_size == 16 << 20
    assert image.read_bytes()[1024 + 56 : 1024 + 58] == b"\x53\xef"  # ext4 superblock magic
    c = codec_throughput(image.read_bytes(), 64 << 10, CodecName.LZ4)
    assert 1.3 < c["ratio"] < 20 and c["compress_mb_s"] > 0 and c["decompress_mb_s"] > 0


def test_figures_carry_ceilings_and_same_run_peers() -> None:
    row = {"randread_mb_s": 100.0, "randwrite_mb_s": 50.0, "fill_mb_s": 80.0, "randread_p99_ms": 9.0,
           "randwrite_p99_ms": 12.0}  # fmt: skip
    result = {
        "rows": [
            {"system": "process", "block": 4096, **row, "ratio": 2.0},
            {"system": "nbdkit", "block": 4096, **{k: v * 2 for k, v in row.items()}},
        ],
        "ceilings": {"4096": {"compress_mb_s": 200.0, "decompress_mb_s": 400.0, "ratio": 2.5}},
    }
    figs = {f.name: f for f in figures_from(result)}
    read = figs["randread_mb_s_4k"]
    assert read.ceiling == 400.0 and read.ratio_to_ceiling() == 0.25
    assert read.ratio_to_peers() == {"nbdkit-file": 0.5}
    assert figs["randread_p99_ms_4k"].ratio_to_peers() == {"nbdkit-file": 2.0}  # lower latency is better
    assert figs["compression_ratio_4k"].ratio_to_ceiling() == 0.8


def test_front_end_systems_are_compared_with_the_one_process_tier() -> None:
    row = {"randread_mb_s": 100.0, "randwrite_mb_s": 50.0, "fill_mb_s": 80.0, "randread_p99_ms": 9.0,
           "randwrite_p99_ms": 12.0}  # fmt: skip
    result = {
        "rows": [
            {"system": "process-fe2", "block": 4096, **{k: v * 1.5 for k, v in row.items()}},
            {"system": "inline", "block": 4096, **row},
        ],
        "ceilings": {"4096": {"compress_mb_s": 200.0, "decompress_mb_s": 400.0, "ratio": 2.5}},
    }
    figs = {f.name: f for f in figures_from(result, main="process-fe2")}
    assert figs["randwrite_mb_s_4k"].peers == {"carina-inline (1 process)": 50.0}
    assert [figs[f"process-fe2_vs_inline_{op}_4k"].value for op in ("randread", "randwrite", "fill")] == [1.5] * 3
    assert split_system("process-fe2") == ("process", 2) and split_system("inline") == ("inline", 1)
    assert split_system("nbdkit-fe2") == ("nbdkit-fe2", 1)  # not a tier: no front ends


def test_bench_config_rejects_unknown_systems() -> None:
    with pytest.raises(ConfigError, match="systems"):
        BenchConfig(systems=["ceph"])
    with pytest.raises(ConfigError, match="systems"):
        BenchConfig(systems=["nbdkit-fe2"])
    with pytest.raises(ConfigError, match="clients"):
        BenchConfig(systems=["inline-fe2"], clients=3)


def test_importing_the_package_stays_light() -> None:
    code = "import sys, carina.infra.storage as s; s.TierConfig; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_process_loop_system_serves_with_one_worker_fewer_and_round_trips(tmp_path: Path) -> None:
    """``process-loop`` is the process pool with ``workers - 1`` worker processes and the event loop."""
    import hashlib

    from carina.infra.storage.loadtest import _tree_pids, start_target

    image = tmp_path / "src.raw"
    image.write_bytes(b"".join(hashlib.sha256(b"%d" % i).digest() * 64 for i in range(4096)))  # 8 MiB
    cfg = BenchConfig(image_bytes=16 << 20, codec=CodecName.ZLIB, workers=3, systems=["process", "process-loop"])
    trees = {}
    for system in cfg.systems:
        with start_target(system, tmp_path, cfg, 64 << 10) as target:
            trees[system] = len(_tree_pids(target.proc.pid))
            subprocess.run(["nbdcopy", str(image), target.url], check=True)
            back = tmp_path / f"{system}.raw"
            subprocess.run(["nbdcopy", target.url, str(back)], check=True)
            got, n = back.read_bytes(), image.stat().st_size
            assert got[:n] == image.read_bytes() and got[n:] == bytes(len(got) - n)
    assert trees["process-loop"] == trees["process"] - 1
