"""Benchmark: a guest workload's slowdown while its disk is scanned from outside vs by an in-guest agent.

One QEMU guest (TCG, 1 vCPU, 512 MiB; the provisioning tests' kernel + busybox
initramfs) mounts its qcow2 disk (a fake Debian tree + filler) and repeats
``A B A C`` rounds of a workload (drop caches, read and md5sum the filler, append
to a log on the disk), timing each iteration with /proc/uptime (10 ms ticks):
A alone; B while a busybox *agent-style* scan loops inside the guest (walk every
inode testing setuid/world-writable bits, read the package DB and account/sshd
files); C while the host takes a QMP ``blockdev-snapshot-sync`` and runs carina's
full scan of the frozen layer in a loop (a child process). Both scanners run
continuously, at the same nice value; the run is repeated at nice 0 and 19.

Slowdown = median iteration time of B (or C) / median of A (A interleaved, so drift
on a shared machine affects all phases). Cost per scan = extra guest time in the
phase / scans completed in it. See :mod:`carina.testing.introspect_live`.

Run: ``PYTHONPATH=$PWD/src .venv/bin/python benchmarks/security_introspect/bench_live.py``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics as st
import tempfile
from pathlib import Path

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.testing.introspect_live import build_guest, run_experiment
from carina.testing.provision import find_guest_kernel


def _summary(res, nice: int) -> dict:
    a, b, c = (res.iters[p] for p in "ABC")
    ma = st.median(a)
    agent_scans, host_scans = sum(res.agent_scans), len(res.host_scan_s)
    return {
        "nice": nice,
        "median_ms": {"A": ma, "B": st.median(b), "C": st.median(c)},
        "slowdown_agent": st.median(b) / ma,
        "slowdown_agentless": st.median(c) / ma,
        "scans_agent": agent_scans,
        "scans_agentless": host_scans,
        "extra_ms_per_scan_agent": (sum(b) - ma * len(b)) / max(agent_scans, 1),
        "extra_ms_per_scan_agentless": (sum(c) - ma * len(c)) / max(host_scans, 1),
        "snapshot_ms": [round(s * 1000, 2) for s in res.snapshot_s],
        "host_scan_median_s": st.median(res.host_scan_s),
        "host_partial": res.host_partial,
        "frozen_changed": res.frozen_changed,
        "iters_ms": res.iters,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--filler-files", type=int, default=200)
    ap.add_argument("--filler-mb", type=int, default=16)
    args = ap.parse_args()
    kernel = find_guest_kernel()
    rows, load = [], [os.getloadavg()[0]]
    for nice in (0, 19):
        work = Path(tempfile.mkdtemp(prefix="carina-live-"))
        try:
            initrd, disk, _ = build_guest(
                work, kernel, iters=args.iters, rounds=args.rounds, filler_files=args.filler_files,
                filler_mb=args.filler_mb, nice=nice,
            )  # fmt: skip
            rows.append(_summary(run_experiment(work, kernel, initrd, disk, accel="tcg", nice=nice), nice))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        load.append(os.getloadavg()[0])
    figures = []
    for r in rows:
        figures.append(
            Figure(
                name=f"guest_slowdown_nice{r['nice']}",
                value=r["slowdown_agentless"],
                unit="x",
                higher_is_better=False,
                basis=Basis.MEASURED,
                peers={"in-guest agent": r["slowdown_agent"]},
            )
        )
    rec = make_record(
        name="security_introspect_live",
        figures=figures,
        config={**vars(args), "accel": "tcg", "vcpus": 1, "memory_mib": 512, "nices": [0, 19]},
        metrics={"by_nice": rows, "host_load_avg_1min": load, "host_cpus": os.cpu_count()},
        notes=(
            "CPU record, TCG guest on a shared 2-core machine (1-min load averages in metrics): timings are noisy. "
            "The agent is busybox doing a scan's file work inside the guest, not carina; carina's host scans are "
            "full scans (inventory incl. a walk of every inode) of the frozen snapshot layer."
        ),
    )
    print(write_record(rec))
    print("nice  slowdown(agent)  slowdown(agentless)  scans(agent)  scans(agentless)  snapshot_ms")
    for r in rows:
        print(
            f"{r['nice']:>4}  {r['slowdown_agent']:15.2f}  {r['slowdown_agentless']:19.2f}  "
            f"{r['scans_agent']:12d}  {r['scans_agentless']:16d}  {r['snapshot_ms']}"
        )


if __name__ == "__main__":
    main()
