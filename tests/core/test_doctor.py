import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

from carina.core.doctor import EXTRAS, SYSTEM_TOOLS, collect
from carina.core.probes import filesystem_of, probe_o_direct


@pytest.fixture(scope="module")
def report_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("doctor")
    out = subprocess.run(
        [sys.executable, "-m", "carina", "doctor", "--json", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout), path


def test_json_shape(report_json):
    report, _ = report_json
    for key in (
        "carina",
        "python",
        "system",
        "torch",
        "pinned_memory",
        "io_uring",
        "paths",
        "tools",
        "extras",
        "flags",
        "missing",
    ):
        assert key in report
    assert set(report["extras"]) == set(EXTRAS)
    assert [t["name"] for t in report["tools"]] == list(SYSTEM_TOOLS)
    assert all({"what", "fix"} <= set(m) for m in report["missing"])
    from carina.io.backends import choose_backend

    assert report["io_backend"]["backend"] == choose_backend("auto").backend.name
    from carina.io._rows import gather_path_report

    assert report["io_backend"]["gather_path"] == gather_path_report()  # the batched-gather path auto takes, and why
    assert report["io_backend"]["gather_path"]["path"] in ("gpu", "host")


def test_tells_the_truth_about_this_machine(report_json):
    report, path = report_json
    assert report["python"]["version"] == platform.python_version()
    assert report["system"]["cpus"] == os.cpu_count()
    has_torch = importlib.util.find_spec("torch") is not None
    assert report["torch"]["installed"] is has_torch
    if has_torch:
        import torch

        assert report["torch"]["version"] == torch.__version__
        assert report["torch"]["cuda_available"] is torch.cuda.is_available()
        assert len(report["torch"]["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
        if not torch.cuda.is_available():
            assert report["pinned_memory"]["works"] is False
    for tool in report["tools"]:
        found = shutil.which(tool["name"]) or shutil.which(tool["name"], path="/usr/sbin:/sbin")
        assert (tool["path"] is not None) == (found is not None), tool["name"]
        if tool["path"] is None:
            assert tool["install"].startswith("apt-get install")
    [probe] = report["paths"]
    assert probe["filesystem"] == filesystem_of(path)[0]
    assert probe["o_direct"] == probe_o_direct(path)[0]
    for name, extra in report["extras"].items():
        missing = [m for m in EXTRAS[name] if importlib.util.find_spec(m.split(".")[0]) is None]
        if missing:
            assert not extra["installed"]


def test_missing_lists_a_fix_for_each_missing_tool():
    report = collect(paths=[], tools=True)
    missing_tools = {t.name for t in report.tools if t.path is None}
    listed = {m.what.removeprefix("tool ") for m in report.missing if m.what.startswith("tool ")}
    assert listed == missing_tools


def test_o_direct_probe_reports_failure_on_tmpfs_like_paths(tmp_path):
    ok, why = probe_o_direct(tmp_path / "does-not-exist")
    assert ok is False and why
