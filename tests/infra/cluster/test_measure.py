import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from carina.infra.cluster.checks import CheckContext, Status
from carina.infra.cluster.checks.compute import HplSolve, MatmulRate, hpl_flops, hpl_residual
from carina.infra.cluster.checks.host import DiskBandwidth, HostMemoryBandwidth
from carina.infra.cluster.collectives import bus_bandwidth, free_port, run_local_sweep
from carina.infra.cluster.multinode import find_slow, pairwise_bandwidth, ring_bandwidth


def test_bus_bandwidth_follows_nccl_tests():
    # 1 GB in 0.1 s on 8 ranks: algbw 10 GB/s; all-reduce busbw x 2*7/8, the others x 7/8.
    assert bus_bandwidth("all_reduce", 10**9, 0.1, 8) == pytest.approx((10.0, 17.5))
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_bandwidth(op, 10**9, 0.1, 8) == pytest.approx((10.0, 8.75))


def test_hpl_formula_and_residual():
    assert hpl_flops(1000) == pytest.approx(2 / 3 * 1e9 + 2e6)
    gen = torch.Generator().manual_seed(1)
    a = torch.rand(200, 200, generator=gen, dtype=torch.float64) - 0.5
    b = torch.rand(200, 1, generator=gen, dtype=torch.float64) - 0.5
    x = torch.linalg.solve(a, b)
    assert hpl_residual(a, x, b) < 16
    wrong = x.clone()
    wrong[7] += 1e-6
    assert hpl_residual(a, wrong, b) > 16


def test_cpu_checks_run_and_grade_against_given_specs(tmp_path):
    ctx = CheckContext(device="cpu", quick=True, paths=(str(tmp_path),))
    hpl = HplSolve().run(ctx)
    assert hpl.status is Status.PASS and hpl.metrics["hpl_residual"] < 16 and hpl.metrics["hpl_gflops"] > 0
    assert set(MatmulRate().run(ctx).metrics) == {"bf16_tflops", "fp32_tflops", "fp64_tflops"}
    disk = DiskBandwidth().run(ctx)
    assert disk.status is Status.PASS and disk.metrics["disk0_read_gbps"] > 0
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    impossible = CheckContext(device="cpu", quick=True, specs={"host_mem_gbps": 1e6})
    assert HostMemoryBandwidth().run(impossible).status is Status.FAIL


def test_gloo_collectives_give_right_results_and_rows():
    rows = run_local_sweep(2, backend="gloo", sizes=[1 << 12, 1 << 16], iters=2)
    assert [(r["op"], r["bytes"]) for r in rows] == [
        (op, size) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") for size in (1 << 12, 1 << 16)
    ]
    for r in rows:
        factor = 1.0 if r["op"] == "all_reduce" else 0.5
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)


def test_find_slow_names_link_and_node():
    links = {f"{i}-{j}": 10.0 + 0.01 * (i + j) for i in range(6) for j in range(i + 1, 6)}
    for other in (0, 1, 2, 4, 5):
        key = f"{min(other, 3)}-{max(other, 3)}"
        links[key] = 1.0
    verdict = find_slow(links)
    assert verdict["nodes"] == ["3"] and len(verdict["links"]) == 5
    assert find_slow({"0-1": 5.0, "0-2": 5.1, "1-2": 5.0}) == {"links": [], "nodes": []}


def _links_worker(rank, world, port, slow_rank, out):
    if rank == slow_rank:  # a throttled node: every message it sends is late
        original = dist.send

        def late_send(tensor, dst, *args, **kwargs):
            time.sleep(0.03)
            return original(tensor, dst, *args, **kwargs)

        dist.send = late_send
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    pairs = pairwise_bandwidth(nbytes=1 << 16, iters=2)
    ring = ring_bandwidth(nbytes=1 << 16, iters=2)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"pairs": pairs, "ring": ring}))


@pytest.mark.slow
def test_pairwise_test_names_the_throttled_node(tmp_path):
    out = tmp_path / "links.json"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_links_worker, args=(6, free_port(), 3, str(out)), nprocs=6, join=True)
    result = json.loads(out.read_text())
    assert len(result["pairs"]) == 15 and len(result["ring"]) == 6
    assert find_slow(result["pairs"])["nodes"] == ["3"]
