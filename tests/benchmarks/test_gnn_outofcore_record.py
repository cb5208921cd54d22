"""bench_outofcore's record: stage-time checks from per-stage counts, and the zero-copy peer's guards."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gnn"))

import outofcore_peers  # noqa: E402
import outofcore_record  # noqa: E402


def _run(**over):
    run = {
        "seeds_per_s": 1000.0,
        "batches": 4,
        "train_s": 0.2,
        "check_s": 0.04,
        "stage_s": {"sample": 0.3, "plan": 0.1, "read": 2.0, "assemble": 0.12},
        "stage_n": {"sample": 5, "plan": 5, "read": 5, "assemble": 4},
        "predicted": {
            "stages": {"sample": 0.08, "disk": 0.46, "transfer": 0.02, "compute": 0.05},
            "batch_s": 0.5,
            "seeds_per_s": 1024.0,
        },
    }
    return run | over


def test_stage_check_divides_by_the_times_each_stage_ran():
    got = outofcore_record.stage_check(_run() | {"batch_size": 512})
    # sample lane = (sample + plan) / 5 sampled; disk = read / 5 reads; transfer = (assemble - checks) / 4
    assert got["sample"]["measured_s"] == pytest.approx(0.08)
    assert got["disk"]["measured_s"] == pytest.approx(0.4)
    assert got["transfer"]["measured_s"] == pytest.approx(0.02)
    assert got["compute"]["measured_s"] == pytest.approx(0.05)
    assert got["batch"]["measured_s"] == pytest.approx(0.512)
    assert got["disk"]["predicted_over_measured"] == pytest.approx(1.15)
    assert got["batch"]["predicted_over_measured"] == pytest.approx(0.5 / 0.512)


def test_stage_summary_counts_pairs_within_15_percent():
    bench = SimpleNamespace(
        carina={0.5: _run()},
        ablations={"no-pipelining": _run(stage_s={"sample": 0.3, "plan": 0.1, "read": 4.0, "assemble": 0.12})},
        args=SimpleNamespace(batch_size=512, device="cuda"),
    )
    s = outofcore_record.stage_summary(bench)
    assert s["pairs"] == 10
    # carina@0.5: sample 1.0, disk 1.15 (on the edge: in), transfer 1.0, compute 1.0, batch 0.977 -> 5 in;
    # no-pipelining: disk 0.575 out, the other four in
    assert s["within"] == 9
    assert set(s["runs"]) == {"carina@0.5", "carina no-pipelining"}
    # on CUDA only the read stage and the batch are timed alone: 4 such pairs, the no-pipelining disk out
    assert (s["within_own"], s["own"]) == (3, 4)
    assert s["runs"]["carina@0.5"]["sample"]["timer"] == "shared stream"
    bench.args.device = "cpu"  # everything synchronous: every timer is the stage's own
    assert outofcore_record.stage_summary(bench)["own"] == 10


def test_stage_check_skips_stages_that_never_ran():
    got = outofcore_record.stage_check(_run(stage_n={}, batches=0) | {"batch_size": 512})
    assert set(got) == {"batch"}


def test_zero_copy_refuses_the_cpu():
    with pytest.raises(ValueError, match="CUDA device and pinned"):
        outofcore_peers.ZeroCopy(torch.zeros(4, 2), "cpu")


@pytest.mark.gpu
def test_zero_copy_gathers_the_pinned_rows_bit_exact():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    host = torch.randn(1000, 64).pin_memory()
    zc = outofcore_peers.ZeroCopy(host, "cuda")
    ids = torch.tensor([999, 0, 17, 17, 512])
    x = zc.assemble(zc.plan(ids), zc.read(None))
    assert x.device.type == "cuda" and zc.view.data_ptr() == host.data_ptr()  # no copy of the table
    assert torch.equal(x.cpu(), host[ids])
    host[17] = 3.0  # the view aliases host memory: a write on the host is what the GPU reads next
    assert torch.equal(zc.assemble(zc.plan(ids), None).cpu()[2], host[17])


def test_stage_check_prices_the_read_stage_as_disk_plus_host_gather():
    run = _run()
    run["predicted"]["stages"] |= {"disk": 0.3, "gather": 0.16}
    got = outofcore_record.stage_check(run | {"batch_size": 512})
    assert got["disk"]["predicted_s"] == pytest.approx(0.46) and got["disk"]["measured_s"] == pytest.approx(0.4)


def test_stage_check_drops_the_warm_up_calls():
    """With per-call times the first `warmup` calls are left out (the first read faults a fresh page buffer in)."""
    run = _run(
        warmup=1,
        calls={
            "sample": [0.5, 0.05, 0.07],
            "plan": [0.1, 0.01, 0.01],
            "read": [3.0, 0.4, 0.44],
            "assemble": [0.2, 0.03, 0.05],
            "check": [0.01, 0.01, 0.01],
            "train": [0.9, 0.05, 0.05],
        },
    )
    got = outofcore_record.stage_check(run | {"batch_size": 512})
    assert got["sample"]["measured_s"] == pytest.approx(0.07)  # (0.06 + 0.08) / 2
    assert got["disk"]["measured_s"] == pytest.approx(0.42)
    assert got["transfer"]["measured_s"] == pytest.approx(0.03)  # assemble less the checks, per call
    assert got["compute"]["measured_s"] == pytest.approx(0.05)


def test_stage_check_adds_the_device_gather_to_assemble():
    run = _run()
    run["predicted"]["stages"] |= {"transfer": 0.005, "device_gather": 0.015, "gather": 0.0}
    got = outofcore_record.stage_check(run | {"batch_size": 512})
    assert got["transfer"]["predicted_s"] == pytest.approx(0.02)


def _bench_with_alternatives(again: float | None):
    pred = lambda x: {"seeds_per_s": x}  # noqa: E731
    ablations = {
        "no-hole-coalescing": {"seeds_per_s": 110.0, "predicted": pred(95.0), "budget": 0.5},
        "host-gather cpu@1": {"seeds_per_s": 900.0, "predicted": pred(800.0), "budget": 1.0},
    }
    if again is not None:
        ablations["again"] = {"seeds_per_s": again, "predicted": pred(100.0), "budget": 0.5}
    carina = {
        0.5: {"seeds_per_s": 90.0, "predicted": pred(100.0)},
        1.0: {"seeds_per_s": 1000.0, "predicted": pred(700.0)},
    }
    return SimpleNamespace(peer_budget=0.5, carina=carina, ablations=ablations)


def test_recommended_per_budget_with_the_pick_run_again():
    rec = outofcore_record.recommended_by_budget(_bench_with_alternatives(again=120.0))
    # at 0.5 the pick (predicted 100 > 95) ran at 90 then 120: mean 105, against 110 measured for gap 0
    assert rec["0.5"]["picked"] == "carina@0.5" and rec["0.5"]["measured"]["carina@0.5"] == pytest.approx(105.0)
    assert rec["0.5"]["ratio"] == pytest.approx(105 / 110)
    assert "carina again" not in rec["0.5"]["measured"] and "carina host-gather cpu@1" not in rec["0.5"]["measured"]
    # at 1.0 the model picked the CPU path (800 > 700) and carina@1 (device path) measured faster
    assert rec["1"]["picked"] == "carina host-gather cpu@1" and rec["1"]["ratio"] == pytest.approx(0.9)
    alone = outofcore_record.recommended(_bench_with_alternatives(again=None))
    assert alone["ratio"] == pytest.approx(90 / 110)


def test_sampler_ms_leaves_the_warm_up_out_and_has_no_device_time_without_events():
    cpu = {"sample": [0.050, 0.004, 0.006], "plan": [0.010, 0.001, 0.003]}
    got = outofcore_peers.sampler_ms(cpu, {}, warmup=1)
    assert got["sample_cpu_ms"] == pytest.approx(5.0) and got["lookup_cpu_ms"] == pytest.approx(2.0)
    assert got["sample_device_ms"] is None and got["lookup_device_ms"] is None
    dev = outofcore_peers.sampler_ms(cpu, {"sample": [0.002], "plan": [0.001]}, warmup=1)
    # fewer calls than the warm-up: every call counts
    assert dev["sample_device_ms"] == pytest.approx(2.0) and dev["lookup_device_ms"] == pytest.approx(1.0)


def test_warm_read_reads_every_row_of_batches_the_timed_runs_do_not_sample(tmp_path):
    from carina.gnn.dataset import PrepareConfig, prepare
    from carina.gnn.runner import RunConfig
    from carina.gnn.sampler import NeighborSampler
    from carina.gnn.train import TrainConfig
    from carina.io import IOConfig, IOEngine

    ds = prepare(PrepareConfig(num_nodes=2048, avg_degree=6, feature_dim=32, train_fraction=0.2, seed=2), tmp_path)
    cfg = RunConfig(train=TrainConfig(fanouts=[5, 3], batch_size=32))
    with IOEngine(IOConfig()) as eng:
        got = outofcore_peers.warm_read(ds, cfg, eng, 3)
    assert got["batches"] == 3 and got["seed"] == cfg.train.seed + outofcore_peers.WARM_SEED_OFFSET

    def first(seed):
        sampler = NeighborSampler(ds.graph, fanouts=cfg.train.fanouts, seed=seed)
        return [b.n_id for _, b in zip(range(3), sampler.batches(ds.train_idx, 32), strict=False)]

    warm, timed = first(got["seed"]), first(cfg.train.seed)
    assert got["rows"] == sum(int(n.numel()) for n in warm)
    assert not all(torch.equal(w, t) for w, t in zip(warm, timed, strict=True))
