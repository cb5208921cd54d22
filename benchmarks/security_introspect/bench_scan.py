"""Benchmark: agentless scan time and memory vs image size, peers, and fleet throughput.

Built at run time (no root mounts): a fake Debian tree with a real dpkg status file plus
filler files (40 files per MB, like /usr/share), packed as ext4 -> GPT -> qcow2
(uncompressed; the filler is incompressible). Each measurement runs in a fresh process
(wall time includes interpreter start, as for the peers) and reports its peak RSS.

* carina ``scan`` (full: inventory incl. a walk of every inode, advisories, compliance);
* carina packages only (open + dpkg status), the like-for-like with the peers;
* peer: dissect's own ``target-query -f dpkg.status`` (packages only; same library);
* peer: ``debugfs -R "cat /var/lib/dpkg/status"`` on the raw ext4 (ext only, no qcow2);
* reference: ``dpkg-query --admindir`` on the unpacked tree (what an agent inside sees);
* fleet: N copies of the smallest image scanned with 2 workers, images per minute.

Run: ``.venv/bin/python benchmarks/security_introspect/bench_scan.py``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from carina.core.bench import Figure, make_record, write_record
from carina.testing.introspect import FakeDebian, build_image, write_tree

PY = sys.executable
BIN = Path(sys.executable).parent

SCAN = """
import json, resource, sys, time
t = time.perf_counter()
from carina.security.introspect.scan import ScanConfig, scan_many
cfg = ScanConfig(workers=int(sys.argv[2]), db=sys.argv[3])
reports = scan_many(sys.argv[4:], cfg)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"wall": wall, "rss_mb": max(rss, kids), "partial": any(r.partial for r in reports),
                  "packages": len(reports[0].inventory.packages), "entries": len(reports[0].inventory.file_modes),
                  "findings": len(reports[0].findings)}))
"""

PACKAGES = """
import json, resource, sys, time
t = time.perf_counter()
from carina.security.introspect.image import open_image
from carina.security.introspect.packages import parse_dpkg_status
n = len(parse_dpkg_status(open_image(sys.argv[2]).read_text("/var/lib/dpkg/status")))
print(json.dumps({"wall": time.perf_counter() - t, "packages": n,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _py(code: str, *args: str) -> dict:
    out = subprocess.run([PY, "-c", code, "x", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return time.perf_counter() - t


def _best(fn, repeats: int):  # type: ignore[no-untyped-def]
    runs = [fn() for _ in range(repeats)]
    return min(runs, key=lambda r: r["wall"] if isinstance(r, dict) else r)


def _build(work: Path, size_mb: int) -> dict[str, Path]:
    tree = write_tree(work / f"root{size_mb}", FakeDebian(filler_files=40 * size_mb, filler_bytes=size_mb << 20))
    fs = build_image(tree, work / f"fs{size_mb}.ext4", "ext4")
    qcow = build_image(tree, work / f"disk{size_mb}.qcow2", "qcow2", compress=False)
    return {"tree": tree, "ext4": fs, "qcow2": qcow}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,400,800", help="filler MB per image")
    ap.add_argument("--fleet", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="carina-bench-introspect-"))
    fixtures = Path(__file__).resolve().parents[2] / "tests/security/introspect/fixtures"
    db = work / "advisories.json"
    from carina.security.introspect.advisories import import_db

    import_db([fixtures / "osv", fixtures / "tracker.json"], db)
    rows = []
    try:
        for size in sizes:
            imgs = _build(work, size)
            qsize = imgs["qcow2"].stat().st_size / 2**20
            scan = _best(lambda i=imgs: _py(SCAN, "1", str(db), str(i["qcow2"])), args.repeats)
            pk = _best(lambda i=imgs: _py(PACKAGES, str(i["qcow2"])), args.repeats)
            tq = min(
                _wall([str(BIN / "target-query"), "-f", "dpkg.status", str(imgs["qcow2"])]) for _ in range(args.repeats)
            )
            dbg = min(
                _wall(["debugfs", "-R", "cat /var/lib/dpkg/status", str(imgs["ext4"])]) for _ in range(args.repeats)
            )
            dq = min(
                _wall(["dpkg-query", f"--admindir={imgs['tree']}/var/lib/dpkg", "-W"]) for _ in range(args.repeats)
            )
            rows.append(
                {
                    "filler_mb": size,
                    "qcow2_mb": round(qsize, 1),
                    "scan_s": scan["wall"],
                    "scan_rss_mb": scan["rss_mb"],
                    "entries": scan["entries"],
                    "packages": scan["packages"],
                    "findings": scan["findings"],
                    "partial": scan["partial"],
                    "packages_only_s": pk["wall"],
                    "packages_only_rss_mb": pk["rss_mb"],
                    "target_query_dpkg_s": tq,
                    "debugfs_cat_status_s": dbg,
                    "dpkg_query_tree_s": dq,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            if size != min(sizes):
                shutil.rmtree(imgs["tree"])
                imgs["ext4"].unlink()
        small = work / f"disk{min(sizes)}.qcow2"
        fleet = [work / f"fleet{i}.qcow2" for i in range(args.fleet)]
        for f in fleet:
            shutil.copyfile(small, f)
        fl = _py(SCAN, "2", str(db), *map(str, fleet))
        per_min = args.fleet / fl["wall"] * 60
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    big = rows[-1]
    figures = [
        Figure(
            name=f"scan_{big['qcow2_mb']:.0f}MB_qcow2",
            value=big["scan_s"],
            unit="s",
            higher_is_better=False,
            ceiling=10.0,
            ceiling_source="issue target (<= 10 s for an 800 MB qcow2)",
            peers={"target-query dpkg.status (packages only)": big["target_query_dpkg_s"]},
        ),
        Figure(
            name="packages_only",
            value=big["packages_only_s"],
            unit="s",
            higher_is_better=False,
            peers={
                "target-query dpkg.status": big["target_query_dpkg_s"],
                "debugfs cat status (raw ext4)": big["debugfs_cat_status_s"],
                "dpkg-query on unpacked tree (agent view)": big["dpkg_query_tree_s"],
            },
        ),
        Figure(
            name="scan_peak_rss",
            value=big["scan_rss_mb"],
            unit="MB",
            higher_is_better=False,
            ceiling=500.0,
            ceiling_source="issue target (<= 500 MB)",
        ),
        Figure(name="fleet_throughput", value=per_min, unit="images/min", peers={}),
    ]
    rec = make_record(
        name="security_introspect_scan",
        figures=figures,
        config={"sizes_mb": sizes, "fleet": args.fleet, "repeats": args.repeats, "workers_fleet": 2},
        metrics={
            "by_size": rows,
            "fleet": {
                "images": args.fleet,
                "wall_s": fl["wall"],
                "rss_mb": fl["rss_mb"],
                "image_mb": rows[0]["qcow2_mb"],
            },
        },
        notes="Synthetic Debian trees (real dpkg status + filler); wall includes interpreter start for all tools.",
    )
    print(write_record(rec))


if __name__ == "__main__":
    main()
