"""The cost model pinned to the committed session-10 H200 records (lane_h200_s9 at a365d0c).

Re-predicts every carina run of ``gnn_outofcore_{papers_25x10,igb_15x10x5}_h200_s9`` from the lane's
calibration and profiled workloads (``benchmarks/gnn/h200/s9``) and checks the numbers the goals record
reports. A change to the model moves these numbers: update them with the reason, in the commit and
in docs/gnn.md.
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gnn"))

import goals_h200  # noqa: E402

from carina.gnn.diskcost import PAGE  # noqa: E402

S9 = goals_h200.SESSIONS["s9"]


@pytest.fixture(scope="module")
def recs():
    return {ds: goals_h200.load(S9.records[ds]) for ds in goals_h200.DATASETS}


@pytest.mark.parametrize("ds", goals_h200.DATASETS)
def test_unchanged_terms_reproduce_the_recorded_predictions(recs, ds):
    """Sample, gather, transfer and compute as the lane predicted them; the disk less one page per IO.

    The additive form of a365d0c charged ``IOs / IOPS + pages 4 KiB / B``; this tree's charges each
    request ``1 / IOPS - 4 KiB / B`` (the page its IOPS were measured with) plus the pages, so the two
    differ by exactly ``IOs x 4 KiB / B``.
    """
    machine, work = S9.machine(), S9.workload(ds)
    for key, run in goals_h200.carina_runs(recs[ds]).items():
        now = goals_h200.predict_run(machine, work, run)
        was = run["predicted"]
        for stage in ("sample", "gather", "transfer", "compute"):
            assert now.stages[stage] == pytest.approx(was["stages"][stage], rel=1e-12), (key, stage)
        assert now.disk_ios == pytest.approx(was["disk_ios"], rel=1e-12)
        page_s = PAGE / (machine.ssd_read_gbps * 1e9)
        assert was["stages"]["disk"] - now.stages["disk"] == pytest.approx(now.disk_ios * page_s, rel=1e-9, abs=1e-15)


def test_rates_the_runs_measured(recs):
    rates = goals_h200.in_run_rates(recs)
    # the host-gather peer's read stage: all unique rows of a batch, CPU gather from pinned memory
    assert rates["host_gather_gbps"]["papers"] == pytest.approx(9.2920, rel=1e-4)
    assert rates["host_gather_gbps"]["igb"] == pytest.approx(9.9150, rel=1e-4)
    # the zero-copy peer: 23.70 ns a 512 B row, 77.16 ns a 4 KiB row -> 67.0 GB/s + 16.06 ns a row
    assert rates["uva_s_per_row"]["512"] == pytest.approx(23.697e-9, rel=1e-4)
    assert rates["uva_s_per_row"]["4096"] == pytest.approx(77.164e-9, rel=1e-4)
    assert rates["uva_gbps"] == pytest.approx(67.03, rel=1e-3) and rates["uva_row_ns"] == pytest.approx(16.06, rel=1e-3)


@pytest.mark.parametrize(
    ("ds", "recorded", "now", "in_run", "own"),
    [("papers", (4, 25), (4, 25), (5, 25), (0, 1, 10)), ("igb", (8, 35), (12, 35), (13, 35), (1, 6, 14))],
)
def test_stage_predictions_within_15_percent_before_and_after(recs, ds, recorded, now, in_run, own):
    """Pairs (run, stage) within +-15%: as recorded, re-predicted, and with the in-run rates (derived counts)."""
    rates = goals_h200.in_run_rates(recs)
    work, machine = S9.workload(ds), S9.machine()
    before = goals_h200.summary(goals_h200.recorded_checks(recs[ds]))
    after = goals_h200.repredict(recs[ds], machine, work)
    tuned = goals_h200.repredict(recs[ds], goals_h200.machine_with(machine, rates, ds), work)
    after_s = goals_h200.summary({k: v["check"] for k, v in after.items()})
    tuned_s = goals_h200.summary({k: v["check"] for k, v in tuned.items()})
    assert (before["within"], before["pairs"]) == recorded
    assert (after_s["within"], after_s["pairs"]) == now
    assert (tuned_s["within"], tuned_s["pairs"]) == in_run
    assert (before["within_own"], tuned_s["within_own"], tuned_s["own"]) == own


def test_disk_stage_of_the_papers_pick(recs):
    """carina@0.5 on papers-like: 1,275.5 ms predicted by the lane (IO lane), 1,059.9 ms now, 915.3 ms read a call."""
    run = recs["papers"]["metrics"]["carina"]["0.5"]
    now = goals_h200.predict_run(S9.machine(), S9.workload("papers"), run)
    assert run["predicted"]["batch_s"] == pytest.approx(1.27546, rel=1e-5)
    assert now.stages["disk"] + now.stages["gather"] == pytest.approx(1.059949, rel=1e-5)
    assert goals_h200.per_batch(run, "read") == pytest.approx(0.915292, rel=1e-5)


@pytest.mark.parametrize(("ds", "recorded", "now"), [("papers", 0.9394, 0.4309), ("igb", 2.7469, 1.1808)])
def test_carina_at_full_cache_io_over_compute(recs, ds, recorded, now):
    """G2's condition (IO <= 0.8x compute) by the lane's model and by this tree's with the in-run rates."""
    rates = goals_h200.in_run_rates(recs)
    machine = goals_h200.machine_with(S9.machine(), rates, ds)
    _, g2 = goals_h200.g2(ds, recs[ds], S9.workload(ds), machine)
    assert g2["condition_recorded"]["io_over_device"] == pytest.approx(recorded, rel=1e-3)
    assert g2["condition_now"]["io_over_device"] == pytest.approx(now, rel=1e-3)
    assert g2["measured_lanes"]["carina@1"]["read_ms"] == pytest.approx(6.5115 if ds == "papers" else 56.945, rel=1e-4)
