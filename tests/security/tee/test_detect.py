"""Detection against a fake NVML, a fake nvidia-smi and fake /dev + /proc trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.security.tee.detect import CpuTee, GpuCcMode, detect, detect_cpu_tee, detect_gpu_cc
from carina.testing.tee import FakeNvml, fake_smi, make_tree


@pytest.mark.parametrize(
    ("state", "mode"),
    [
        ("on", GpuCcMode.ON),
        ("devtools", GpuCcMode.DEVTOOLS),
        ("off", GpuCcMode.OFF),
        ("unsupported", GpuCcMode.UNSUPPORTED),
        ("old-driver", GpuCcMode.UNSUPPORTED),
        ("no-gpu", GpuCcMode.NO_GPU),
    ],
)
def test_gpu_mode_from_nvml(state: str, mode: GpuCcMode) -> None:
    nvml = FakeNvml(state)
    got, source, details = detect_gpu_cc(nvml, run=fake_smi(None))
    assert (got, source) == (mode, "nvml")
    assert nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"
    if state == "on":
        assert details["cc_feature"] == 1 and details["ready"] == 1 and details["cpu_caps"] == 2


@pytest.mark.parametrize(
    ("status", "mode"), [("ON", GpuCcMode.ON), ("OFF", GpuCcMode.OFF), ("DEVTOOLS", GpuCcMode.DEVTOOLS)]
)
def test_nvidia_smi_fallback_when_nvml_has_no_driver(status: str, mode: GpuCcMode) -> None:
    got, source, details = detect_gpu_cc(FakeNvml("no-driver"), run=fake_smi(status))
    assert (got, source, details["cc_status"]) == (mode, "nvidia-smi", status)
    assert details["ready"] == "ready"


def test_no_nvml_and_no_smi_means_no_gpu() -> None:
    assert detect_gpu_cc(FakeNvml("no-driver"), run=fake_smi(None))[:2] == (GpuCcMode.NO_GPU, "none")


def test_unparseable_smi_output_is_unsupported() -> None:
    got, source, _ = detect_gpu_cc(FakeNvml("no-driver"), run=lambda args: "Invalid combination of input arguments.")
    assert (got, source) == (GpuCcMode.UNSUPPORTED, "nvidia-smi")


@pytest.mark.parametrize(
    ("kind", "tee", "evidence"),
    [
        ("tdx", CpuTee.TDX, ["/dev/tdx_guest", "cpu flag tdx_guest"]),
        ("tdx-old", CpuTee.TDX, ["/dev/tdx-guest"]),
        ("sev-snp", CpuTee.SEV_SNP, ["/dev/sev-guest", "cpu flags sev_snp + hypervisor"]),
        ("none", CpuTee.NONE, []),
    ],
)
def test_cpu_tee_from_fake_trees(tmp_path: Path, kind: str, tee: CpuTee, evidence: list[str]) -> None:
    assert detect_cpu_tee(make_tree(tmp_path, kind)) == (tee, evidence)


def test_snp_capable_host_is_not_a_guest(tmp_path: Path) -> None:
    tee, evidence = detect_cpu_tee(make_tree(tmp_path, "snp-host"))
    assert tee is CpuTee.NONE and "not a guest" in evidence[0]


def test_missing_proc_is_no_tee(tmp_path: Path) -> None:
    assert detect_cpu_tee(tmp_path) == (CpuTee.NONE, [])


def test_full_report_attestation_is_honest(tmp_path: Path) -> None:
    report = detect(make_tree(tmp_path, "tdx"), nvml=FakeNvml("on"), run=fake_smi(None))
    d = report.to_dict()
    assert d["cpu_tee"] == "tdx" and d["gpu_cc"] == "on" and d["emulated"] is True
    assert d["attestation"]["cpu"]["status"] == "possible" and "configfs-tsm" in d["attestation"]["cpu"]["reason"]
    assert d["attestation"]["gpu"]["status"] in ("possible", "unavailable")  # never "passed": carina does not attest
    devtools = detect(make_tree(tmp_path / "b", "sev-snp"), nvml=FakeNvml("devtools"), run=fake_smi(None))
    assert devtools.attestation["gpu"]["status"] == "unavailable"
    assert devtools.attestation["cpu"]["reason"].startswith("sev-snp guest device")


def test_this_machine_is_reported_without_faking() -> None:
    report = detect()
    assert report.emulated is False
    assert report.gpu_cc in set(GpuCcMode)
    if report.gpu_cc is not GpuCcMode.ON:
        assert report.attestation["gpu"]["status"] == "unavailable"
