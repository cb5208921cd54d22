import statistics
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carina.errors import ConfigError
from carina.infra.cluster.checks import CHECKS, Check, CheckContext, CheckResult, Status, Threshold, fleet_outliers
from carina.infra.cluster.checks.nvml import ClocksThrottle, EccErrors, GpuPresence, RemappedRows, XidErrors
from carina.infra.cluster.runner import NodeLabel, RunConfig, label_for, run_checks
from carina.testing.nvml import FakeGpu, FakeNvml

NVML_CHECKS = [GpuPresence(), EccErrors(), RemappedRows(), XidErrors(), ClocksThrottle()]


def test_threshold_grades_like_autopilot():
    t = Threshold(warn=0.8, fail=0.25)
    assert t.grade(54.0, 54.5) is Status.PASS
    assert t.grade(40.0, 54.5) is Status.WARN
    assert t.grade(13.0, 54.5) is Status.FAIL
    lat = Threshold(higher_is_better=False)
    assert lat.grade(10, 10) is Status.PASS and lat.grade(50, 10) is Status.FAIL
    with pytest.raises(ConfigError):
        Threshold(warn=0.2, fail=0.5)


@given(st.lists(st.floats(10, 11), min_size=5, max_size=30), st.floats(0.1, 2))
def test_fleet_outliers_finds_only_the_slow_node(healthy, slow):
    values = {f"n{i}": v for i, v in enumerate(healthy)}
    median = statistics.median(values.values())
    # The MAD is floored at 1% of the median and the cut is 3.5 robust z-scores, so only a node more than
    # 3.5% below the fleet's median can be flagged (a tight fleet at 11.0 does flag a node at 10.0).
    assert all(values[n] < median * (1 - 0.035) + 1e-9 for n in fleet_outliers(values))
    values["bad"] = slow
    assert "bad" in fleet_outliers(values)


def test_healthy_fake_fleet_has_no_false_positives():
    ctx = CheckContext(nvml=FakeNvml())
    report = run_checks(RunConfig(), context=ctx, checks=NVML_CHECKS)
    assert report.label is NodeLabel.PASS
    assert [r.status for r in report.results] == [Status.PASS] * len(NVML_CHECKS)


@pytest.mark.parametrize(
    ("gpu", "check", "status"),
    [
        (FakeGpu(ecc=(0, 2)), "ecc", Status.FAIL),
        (FakeGpu(ecc=(5, 0)), "ecc", Status.WARN),
        (FakeGpu(remapped=(0, 1, True, False)), "remapped_rows", Status.FAIL),
        (FakeGpu(remapped=(3, 0, False, True)), "remapped_rows", Status.FAIL),
        (FakeGpu(remapped=(3, 0, False, False)), "remapped_rows", Status.PASS),
        (FakeGpu(xids=[79]), "xid", Status.FAIL),
        (FakeGpu(clocks=(900, 1980, 0x8)), "clocks", Status.FAIL),
        (FakeGpu(clocks=(1500, 1980, 0x20)), "clocks", Status.WARN),
        (FakeGpu(clocks=(1500, 1980, 0x1)), "clocks", Status.PASS),  # idle: GPU not busy
        (FakeGpu(memory_bytes=40 * 2**30), "gpu_presence", Status.FAIL),
    ],
)
def test_each_nvml_error_state_is_detected(gpu, check, status):
    nvml = FakeNvml([FakeGpu(), gpu, FakeGpu()])
    report = run_checks(RunConfig(), context=CheckContext(nvml=nvml), checks=NVML_CHECKS)
    by_name = {r.name: r for r in report.results}
    assert by_name[check].status is status
    assert (
        report.label is {Status.PASS: NodeLabel.PASS, Status.WARN: NodeLabel.WARN, Status.FAIL: NodeLabel.EVICT}[status]
    )
    if status is not Status.PASS:
        assert "GPU 1" in by_name[check].message


def test_missing_gpu_is_detected():
    ctx = CheckContext(nvml=FakeNvml([FakeGpu()] * 7), specs={"gpu_count": 8})
    assert GpuPresence().run(ctx).status is Status.FAIL


class Sleepy(Check):
    name = "sleepy"

    def _run(self, ctx):
        time.sleep(3)
        return CheckResult(self.name, Status.PASS, "late")


class Crashy(Check):
    name = "crashy"
    exclusive = False

    def _run(self, ctx):
        raise RuntimeError("boom")


def test_timeouts_and_crashes_fail_without_stopping_the_run():
    report = run_checks(
        RunConfig(timeout_s=0.2), checks=[Sleepy(), Crashy(), EccErrors()], context=CheckContext(nvml=FakeNvml())
    )
    statuses = {r.name: r for r in report.results}
    assert statuses["sleepy"].status is Status.FAIL and "timed out" in statuses["sleepy"].message
    assert statuses["crashy"].status is Status.FAIL and "boom" in statuses["crashy"].message
    assert statuses["ecc"].status is Status.PASS
    assert report.label is NodeLabel.EVICT


def test_missing_requirements_skip():
    result = GpuPresence().run(CheckContext(nvml=None)) if not GpuPresence().missing(CheckContext()) else None
    skipped = CHECKS.load("pcie_bw")().run(CheckContext(device="cpu"))
    assert skipped.status is Status.SKIP and "cuda" in skipped.message
    assert result is None or result.status in Status


def test_label_and_config_validation():
    assert label_for([]) is NodeLabel.PASS
    assert label_for([CheckResult("a", Status.SKIP, ""), CheckResult("b", Status.WARN, "")]) is NodeLabel.WARN
    with pytest.raises(ConfigError, match="unknown check"):
        RunConfig(checks=["nope"])
    assert RunConfig.from_json(RunConfig(checks=["hpl"]).to_json()).checks == ["hpl"]
