"""A running QEMU guest's disk scanned from outside through QMP snapshots, while the guest works and writes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from introspect_images import dpkg_query

from carina.core.errors import BackendUnavailable
from carina.testing.introspect_live import build_guest, run_experiment
from carina.testing.provision import find_guest_kernel

pytestmark = pytest.mark.slow


def test_live_guest_snapshots_scan_like_the_tree_and_stay_frozen(tmp_path: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 not installed")
    try:
        kernel = find_guest_kernel()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    rounds, iters = 2, 1
    initrd, disk, root = build_guest(tmp_path, kernel, iters=iters, rounds=rounds, filler_files=40, filler_mb=2)
    res = run_experiment(tmp_path, kernel, initrd, disk, accel="tcg", timeout=240)
    assert "LIVE-DONE" in res.console, res.console[-1000:]
    assert {p: len(v) for p, v in res.iters.items()} == {
        "A": 2 * rounds * iters,
        "B": rounds * iters,
        "C": rounds * iters,
    }
    assert len(res.agent_scans) == rounds  # the in-guest agent ran (and was stopped) in every phase B
    assert len(res.snapshot_s) == rounds and len(res.host_scan_s) >= rounds
    expected = dpkg_query(root)
    assert all(pkgs == expected for pkgs in res.packages) and res.host_partial == 0
    assert res.frozen_changed == [False] * rounds  # QEMU never wrote a layer after it was frozen
    info = subprocess.run(
        ["qemu-img", "info", "--output=json", "--backing-chain", str(tmp_path / f"live-overlay{rounds - 1}.qcow2")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert [Path(i["filename"]).name for i in json.loads(info)] == [
        "live-overlay1.qcow2",
        "live-overlay0.qcow2",
        "live.qcow2",
    ]
