"""The session-2 benchmarks run small on CPU: GPU-initiated gathers, the two-file disk ceiling, 4 KiB pairs."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
               "--work", "1", "--repeats", "2", tmp_path=tmp_path)  # fmt: skip
    m = rec["metrics"]
    assert m["gpu_initiated"]["rows_equal"] and m["host_initiated"]["rows_equal"]
    for name in ("io_only", "compute_only", "gpu_initiated", "host_initiated"):  # every round kept, medians used
        assert len(m[name]["wall_s"]) == 2 and m[name]["median_s"] == sum(m[name]["wall_s"]) / 2
    assert m["bound_s"] == max(m["io_only"]["median_s"], m["compute_only"]["median_s"])
    assert m["verdict"] in ("inside noise", "gpu_initiated faster beyond noise", "host_initiated faster beyond noise")
    for name, path in (("gpu_initiated", "gpu"), ("host_initiated", "host")):  # both through RowGather
        assert m[name]["stats"]["path"] == path and m[name]["stats"]["posted"] == m[name]["stats"]["served"] == 5
    assert m["host_initiated"]["stats"]["arena_overflows"] == 0  # the host path's staging fits the arena
    assert m["gpu_initiated"]["out_sum"] == m["host_initiated"]["out_sum"]  # same rows, same compute
    assert rec["figures"][0]["peers"].keys() == {"host_initiated_gather"}


def test_cam_benchmark_names_each_phase_and_dumps_every_stack_when_one_overruns(tmp_path: Path) -> None:
    args = ["--device", "cpu", "--file-size", "4M", "--rows", "64", "--batches", "5", "--work", "1", "--repeats", "1"]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_cam.py"), *args, "--pass-limit", "0.5", "--dir", str(tmp_path),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(BENCH.parents[1] / "src"), "BENCH_CAM_STALL_S": "30"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    named, dumped = proc.stderr.find("[bench_cam] file of 4194304 bytes ..."), proc.stderr.find("Timeout (0:00:02")
    assert 0 <= named < dumped, proc.stderr  # the phase is named first, then its stacks are dumped
    assert "(most recent call first)" in proc.stderr and "in make_file" in proc.stderr  # where the main thread was
    assert not (tmp_path / "out").exists()  # no record from a stopped run


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


LOG = """\
fio-3.33
qd32 pair 0: {"fio": {"iops": 80000.0, "cores": 0.4}, "carina": {"iops": 60000.0, "cores": 0.3, "verified_bytes": 0.0}}
qd32 pair 1: {"carina": {"iops": 70000.0, "cores": 0.2, "verified_bytes": 0.0}, "fio": {"iops": 100000.0, "cores": 0.5}}
qd32 pair 2: {"fio": {"iops": 90000.0, "cores": 0.6}, "carina": {"iops": 45000.0, "cores": 0.1, "verified_bytes": 0.0}}
== sort (timeout 40 s, t=29 s)
0.405 GB/s, 90% of the disk-bound floor
"""


def test_transcribed_records_hold_the_printed_pairs_and_their_medians(tmp_path: Path) -> None:
    tr = importlib.import_module("transcribe_s2_log")
    log = tmp_path / "io_s2.log"
    log.write_text(LOG)
    rr = tr.randread(log, LOG.splitlines())
    (fig,) = rr["figures"]
    assert (fig["value"], fig["ceiling"]) == (60000.0, 90000.0)  # medians of the three pairs
    assert rr["metrics"]["qd32"]["pair_ratio_median"] == 0.7  # of 0.75, 0.7, 0.5
    assert [p["order"] for p in rr["metrics"]["pairs"]] == ["fio first", "carina first", "fio first"]
    assert rr["machine"]["label"] == "h100" and rr["command"] == tr.COMMAND
    assert "transcribed from" in rr["notes"].lower() and "lost when the step limit killed it" in rr["notes"]
    srt = tr.sort(log, LOG.splitlines())
    assert [(f["name"], f["value"], f["ceiling"]) for f in srt["figures"]] == [
        ("external_sort", 0.405, None),
        ("external_sort_fraction_of_disk_bound_floor", 0.9, None),
    ]
    assert srt["environment"] == tr.ENVIRONMENT


def test_device_script_skips_steps_that_cannot_finish_in_the_budget(tmp_path: Path) -> None:
    root = BENCH.parents[1]
    env = {**os.environ, "DEVICE": "cpu", "BUDGET_S": "12", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "CARRY": str(tmp_path / "no-carry"), "FIO": "", "HUGEPAGES": "0"}  # fmt: skip
    proc = subprocess.run(["bash", str(BENCH / "lane_h200.sh")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, need in [("pairs", 30), ("gemm_bf16", 30), ("gemm_tf32", 35), ("cam", 35), ("pairs_posix", 15)]:
        assert f"== {name}: SKIPPED" in proc.stdout and f"needs {need} s" in proc.stdout
    assert "kvikio: ABSENT (no wheels" in proc.stdout  # the one step that fits ran
    assert "== sort: SKIPPED" in proc.stdout and "fio: NOT INSTALLED" in proc.stdout
    assert "== batching: SKIPPED (no fio)" in proc.stdout and "== fio_buffers: SKIPPED (no fio)" in proc.stdout
    assert "huge pages for fio: " in proc.stdout and "(asked 0, " in proc.stdout  # HUGEPAGES=0: nothing reserved
    assert (tmp_path / "io" / "io_lane.log").read_text() == proc.stdout


def test_device_script_runs_only_the_steps_named_in_steps(tmp_path: Path) -> None:
    env = {**os.environ, "DEVICE": "cpu", "BUDGET_S": "60", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "CARRY": str(tmp_path / "no-carry"), "FIO": "", "HUGEPAGES": "0", "STEPS": "kvikio"}  # fmt: skip
    proc = subprocess.run(["bash", str(BENCH / "lane_h200.sh")], cwd=BENCH.parents[1], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("pairs", "gemm_bf16", "gemm_tf32", "cam", "gputests", "pairs_posix", "sort"):
        assert f"== {name}: not in STEPS (kvikio)" in proc.stdout
    assert "kvikio: ABSENT (no wheels" in proc.stdout


def test_cam_verdict_needs_the_two_ranges_apart() -> None:
    cam = importlib.import_module("bench_cam")

    def rec(gpu: list[float], host: list[float]) -> dict:
        return {"gpu_initiated": {"wall_s": gpu}, "host_initiated": {"wall_s": host}}

    assert cam.verdict(rec([1.0, 1.1], [1.2, 1.3])) == "gpu_initiated faster beyond noise"
    assert cam.verdict(rec([1.0, 1.25], [1.2, 1.3])) == "inside noise"  # overlapping ranges
    assert cam.verdict(rec([1.4, 1.5], [1.2, 1.3])) == "host_initiated faster beyond noise"
    assert cam.verdict(rec([1.0], [2.0])).startswith("one repetition")


def test_fio_uses_huge_page_buffers_only_when_enough_are_free(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal: 100 kB\nHugePages_Free:      66\nHugepagesize:       2048 kB\n")
    assert ceiling.fio_memory(4 << 20, 32, info) == (["--iomem=mmaphuge"], "2 MiB huge-page buffers")  # 64 + 2
    args, words = ceiling.fio_memory(4 << 20, 33, info)
    assert args == [] and words.startswith("4 KiB-page buffers")
    cmd, words = ceiling.fio_read_cmd("fio", "a:b", 1 << 20, rw="read", block=1 << 20, depth=4, seconds=1, huge=False)
    assert "--iomem=mmaphuge" not in cmd and "--bs=1048576" in cmd and "--filename=a:b" in cmd
    assert words == "4 KiB-page buffers"


def _h200(rc: Any, folder: str, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: json.loads((rc.RESULTS / folder / f"io_{k}_h200.json").read_text()) for k in keys}


def test_goal_rows_follow_from_the_committed_h200_records() -> None:
    rc = importlib.import_module("recompute_h200")
    recs = _h200(rc, "s5", ("randread", "gemm_bf16", "sort", "cam"))  # session 5: fio with 4 KiB-page buffers
    rows = {r["goal"].split(" ")[0]: r for r in rc.goals(recs)}
    assert rows["rand_read_4KiB_qd32"]["status"].startswith("met") and rows["rand_read_4KiB_qd32"]["ratio"] > 0.9
    assert rows["seq_read_1024KiB_qd32"]["status"].startswith("unmeasured: the ceiling is below")  # 144% of "fio"
    assert rows["gemm_bf16_tflops"]["status"].startswith("unmeasured")
    assert "A+B 604 MB vs budget 369 MB" in rows["gemm_bf16_tflops"]["size_vs_budget"]
    assert (
        rows["external"]["size_vs_budget"] == "8 GiB vs budget 2 GiB (4.0x)" and rows["external"]["status"][:3] == "met"
    )
    assert rows["faster"]["status"].startswith("inside noise: one repetition") and "0.7%" in rows["faster"]["status"]
    recs["sort"]["metrics"]["budget"] *= 2  # data only 2x its budget: the goal's size condition fails
    recs["gemm_bf16"]["metrics"]["bf16"]["device_budget_bytes"] = 10**9  # tiles fit the budget
    rows = {r["goal"].split(" ")[0]: r for r in rc.goals(recs)}
    assert rows["external"]["status"] == "not met: data 2.0x the budget (< 4x)"
    assert rows["gemm_bf16_tflops"]["status"] == "not met: the tiles fit the device budget"


def test_session_6_and_7_goal_rows_against_a_huge_page_fio() -> None:
    rc = importlib.import_module("recompute_h200")
    rows = {r["goal"]: r for r in rc.goals(_h200(rc, ".", ("randread", "gemm_tf32", "sort", "cam")))}
    qd32 = rows["rand_read_4KiB_qd32 (uring) >= 0.9 of fio, <= 4 cores"]
    assert qd32["status"] == "not met" and 0.87 < qd32["ratio"] < 0.89
    seq = rows["seq_read_1024KiB_qd32 (uring) >= 0.9 of fio, <= 4 cores"]
    assert seq["status"] == "met: at or above fio with huge-page buffers in the same run" and seq["ratio"] > 1
    assert rows["gemm_tf32_tflops >= 0.9 of max(compute, IO at ceiling), tiles > GPU budget"]["status"].startswith(
        "met: at or above"
    )
    sort = rows["external sort >= 0.8 of the disk-bound floor, data >= 4x budget"]
    assert sort["size_vs_budget"] == "2 GiB vs budget 0.5 GiB (4.0x)" and sort["status"] == "met"
    assert rows["faster of GPU- and host-initiated gathers becomes the default"]["status"] == (
        "met: inside noise; host-initiated faster by the medians (1.0%) and in 5 of 5 rounds; "
        "RowGather's auto tries host first"
    )
    six = rc.cam_row(json.loads((rc.RESULTS / "s6" / "io_cam_h200.json").read_text()))  # the older host path
    assert six["status"].startswith("not met: gpu_initiated faster beyond noise; gpu-initiated faster by the medians")


def test_far_above_a_huge_page_fio_is_not_a_disk_figure() -> None:
    rc = importlib.import_module("recompute_h200")
    fair = "fio io_uring O_DIRECT read 1024 KiB iodepth=32, 2 MiB huge-page buffers"
    assert rc._ratio_status(1.2, 0.9, fair).startswith("met: at or above")
    assert rc._ratio_status(1.3, 0.9, fair).startswith("unmeasured")
    assert rc._ratio_status(1.1, 0.9, "fio io_uring O_DIRECT read 1024 KiB").startswith("unmeasured")
    assert rc._ratio_status(0.89, 0.9, fair) == "not met"
