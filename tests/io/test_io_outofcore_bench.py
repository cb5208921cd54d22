"""The out-of-core benchmarks' algorithms (GEMM from tiles on disk, external sort), run small on CPU."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from carina.io import IOConfig, IOEngine

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "io"
sys.path.insert(0, str(BENCH))
gemm = importlib.import_module("bench_gemm")
xsort = importlib.import_module("bench_sort")


def _full(seed: int, m: object) -> torch.Tensor:
    nt, t = m.tiles, m.tile  # type: ignore[attr-defined]
    rows = [torch.cat([gemm.make_tile(seed, r * nt + c, t, "cpu") for c in range(nt)], dim=1) for r in range(nt)]
    return torch.cat(rows, dim=0).to(m.dtype)  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("ahead", [2, 0])
def test_out_of_core_gemm_equals_torch_matmul(tmp_path: Path, dtype: str, ahead: int) -> None:
    kw = {"n": 192, "tile": 64, "dtype": gemm.DTYPES[dtype]}
    a, b = gemm.Tiled(path=tmp_path / "a.bin", **kw), gemm.Tiled(path=tmp_path / "b.bin", **kw)
    out = torch.full((192, 192), float("nan"))
    with IOEngine(IOConfig(bounce_bytes=0)) as eng:
        gemm.write_matrices(eng, [a], 1, "cpu")
        gemm.write_matrices(eng, [b], 2, "cpu")
        assert a.path.stat().st_size == 9 * a.tile_bytes
        reader = gemm.TileReader(eng, a, b, "cpu", 3, 4096)  # tiles split into 4 KiB requests
        gemm.multiply(reader, a, ahead, out)
    want = torch.matmul(_full(1, a).float(), _full(2, b).float())
    err = float((out - want).norm() / want.norm())
    assert err < (1e-2 if dtype == "bf16" else 1e-5), err
    assert gemm.reference_error(out, a, 1, 2, "cpu", 2, 1) < (1e-2 if dtype == "bf16" else 1e-5)
    if dtype == "fp32":  # fp32 tiles: every tile product is exact up to summation order
        assert torch.allclose(out, want, rtol=1e-4, atol=1e-3)


def test_gemm_tiles_are_read_from_disk(tmp_path: Path) -> None:
    """Corrupting one tile of B on disk changes exactly the C columns that use it."""
    kw = {"n": 128, "tile": 64, "dtype": torch.float32}
    a, b = gemm.Tiled(path=tmp_path / "a.bin", **kw), gemm.Tiled(path=tmp_path / "b.bin", **kw)
    out = torch.zeros(128, 128)
    with IOEngine(IOConfig(bounce_bytes=0)) as eng:
        gemm.write_matrices(eng, [a], 1, "cpu")
        gemm.write_matrices(eng, [b], 2, "cpu")
        with open(b.path, "r+b") as f:  # B[0, 1] := 0
            f.seek(b.offset(0, 1))
            f.write(bytes(b.tile_bytes))
        gemm.multiply(gemm.TileReader(eng, a, b, "cpu", 3, 1 << 20), a, 2, out)
    bad = _full(2, b)
    bad[:64, 64:] = 0
    want = torch.matmul(_full(1, a), bad)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-3)
    assert gemm.reference_error(out, a, 1, 2, "cpu", 0, 1) > 0.1  # the check notices the damage


def test_external_sort_output_is_the_sorted_input(tmp_path: Path) -> None:
    nkeys, budget = 96 * 1024, 192 << 10  # 768 KiB of keys: 4x the budget
    with IOEngine(IOConfig(queue_depth=16)) as eng:
        want = xsort.write_input(eng, tmp_path / "input.bin", nkeys, 4096)
        keys = np.fromfile(tmp_path / "input.bin", dtype=np.uint64)
        assert len(keys) == nkeys and (xsort.checksum(keys) == want).all()
        for overlap in (True, False):
            times = xsort.sort_file(eng, tmp_path, nkeys, budget, "cpu", overlap)
            assert times["runs"] == 32  # runs of budget / 8 bytes
            ok, got = xsort.verify(eng, tmp_path / "sorted.bin", nkeys, 5000)
            assert ok and (got == want).all()
            assert np.array_equal(np.fromfile(tmp_path / "sorted.bin", dtype=np.uint64), np.sort(keys))


def test_sort_check_catches_a_wrong_output(tmp_path: Path) -> None:
    keys = np.arange(10_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with IOEngine(IOConfig()) as eng:
        np.sort(keys).tofile(tmp_path / "good.bin")
        ok, acc = xsort.verify(eng, tmp_path / "good.bin", len(keys), 777)
        assert ok and (acc == xsort.checksum(keys)).all()
        swapped = np.sort(keys)
        swapped[[10, 11]] = swapped[[11, 10]]
        swapped.tofile(tmp_path / "swapped.bin")
        assert not xsort.verify(eng, tmp_path / "swapped.bin", len(keys), 777)[0]
        other = np.sort(keys)
        other[5] += np.uint64(1)
        other.tofile(tmp_path / "other.bin")
        ok, acc = xsort.verify(eng, tmp_path / "other.bin", len(keys), 777)
        assert ok and not (acc == xsort.checksum(keys)).all()


def test_uint64_order_survives_the_device_sort() -> None:
    keys = np.array([2**64 - 1, 0, 2**63, 2**63 - 1, 1, 2**63 + 1], dtype=np.uint64)
    assert xsort.device_sort(keys, "cpu").tolist() == sorted(keys.tolist())


@pytest.mark.slow
def test_h100_script_runs_both_benchmarks_on_cpu(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DEVICE": "cpu",
        "GEMM_N": "256",
        "GEMM_TILE": "128",
        "SORT_SIZE": "4M",
        "SORT_BUDGET": "1M",
        "CEILING_S": "0.3",
        "FIO": "none",
        "SCRATCH": str(tmp_path),
        "OUT": str(tmp_path / "out"),
        "SUFFIX": "_t",
    }
    root = BENCH.parents[1]
    proc = subprocess.run(
        ["bash", str(BENCH / "h100_followup.sh")], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    g = json.loads((tmp_path / "out" / "io_gemm_t.json").read_text())
    s = json.loads((tmp_path / "out" / "io_sort_t.json").read_text())
    assert [f["name"] for f in g["figures"]] == ["gemm_bf16_tflops", "gemm_fp32_tflops"]
    assert g["metrics"]["fp32"]["overlapped_error"] < 1e-4
    assert g["metrics"]["bf16"]["matrices_bytes"] > 0 and "synchronous_read_then_compute" in g["figures"][0]["peers"]
    assert s["metrics"]["sorted"] and s["metrics"]["checksum_equal"] and s["metrics"]["keys"] == (4 << 20) // 8
    assert s["figures"][0]["ceiling"] > 0
