"""The session-2 benchmarks run small on CPU: GPU-initiated gathers, the two-file disk ceiling, 4 KiB pairs."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "io"
sys.path.insert(0, str(BENCH))
ceiling = importlib.import_module("disk_ceiling")


def _run(script: str, *args: str, tmp_path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--dir", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(BENCH.parents[1] / "src")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (record,) = (tmp_path / "out").glob("*.json")
    return json.loads(record.read_text())


def test_cam_benchmark_checks_both_paths_on_cpu(tmp_path: Path) -> None:
    rec = _run("bench_cam.py", "--device", "cpu", "--file-size", "4M", "--rows", "64", "--batches", "5",
               "--work", "1", tmp_path=tmp_path)  # fmt: skip
    m = rec["metrics"]
    assert m["gpu_initiated"]["rows_equal"] and m["host_initiated"]["rows_equal"]
    assert m["gpu_initiated"]["stats"]["posted"] == m["gpu_initiated"]["stats"]["served"] == 5
    assert m["gpu_initiated"]["out_sum"] == m["host_initiated"]["out_sum"]  # same rows, same compute
    assert rec["figures"][0]["peers"].keys() == {"host_initiated_gather"}


def test_randread_pairs_without_fio_record_no_ceiling(tmp_path: Path) -> None:
    rec = _run("bench_randread.py", "--size", "8M", "--depths", "8", "--pairs", "1", "--seconds", "0.3",
               "--rows", "64", "--fio", "none", tmp_path=tmp_path)  # fmt: skip
    fig = rec["figures"][0]
    assert fig["name"] == "rand_read_4KiB_qd8" and fig["ceiling"] is None and fig["value"] > 0
    assert rec["metrics"]["qd8"]["verified_bytes"] > 0


def test_two_file_ceiling_reads_both_files_without_fio(tmp_path: Path) -> None:
    paths = [tmp_path / "a.bin", tmp_path / "b.bin"]
    for p in paths:
        np.zeros(1 << 20, dtype=np.uint8).tofile(p)
    rate, source = ceiling.read_ceiling_files(paths, None, 0.2, 4)
    assert rate > 0 and "4 threads" in source and "2 files (2 MB)" in source and "fio not installed" in source
