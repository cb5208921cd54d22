"""Time to "node ready": network boot from a COW clone vs copy-to-local-disk then boot (the M2 claim).

Both paths pull from the same storage host over the same modelled link: every export of
the qemu-storage-daemon sits behind one shared throttle group (``link_rate_bps``, 1 Gbit/s
by default). The guest is the carina test guest (TCG): it prints CARINA-READY once it has
mounted its root disk.

- network: ``Provisioner.provision`` (qcow2 clone + NBD export over QMP) for each node,
  then power on; ready = last node's READY line.
- copy: ``nbdcopy --flush`` of the golden image from a read-only NBD export on the same
  throttled link to a local raw file per node (concurrently), then boot from it.

Run::

    .venv/bin/python benchmarks/infra_provision/bench_provision.py            # 1 GiB, N=1,4
    .venv/bin/python benchmarks/infra_provision/bench_provision.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from carina.core.bench import Figure, make_record, write_record
from carina.core.config import Config, require
from carina.infra.provision.config import ExportKind, ProvisionConfig
from carina.infra.provision.power import NodeHandle, QemuPower
from carina.infra.provision.service import Provisioner
from carina.testing.provision import READY_MARKER, build_golden_image, build_initramfs, find_guest_kernel


@dataclass(kw_only=True)
class BenchConfig(Config):
    image_mib: int = 1024
    fill_mib: int = 768
    link_mbit: int = 1000
    nodes: list[int] = field(default_factory=lambda: [1, 4])
    reps: int = 3

    def validate(self) -> None:
        require(self.fill_mib < self.image_mib - 64, "fill must leave room for ext4", key="fill_mib")
        require(self.reps >= 1 and all(n >= 1 for n in self.nodes), "reps and nodes must be >= 1", key="reps")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def qsd_rchar(prov: Provisioner) -> int:
    pid = prov.exports.qsd.daemon.pid()
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar")


def wait_ready(driver: QemuPower, handle: NodeHandle) -> float:
    driver.wait_console(handle, READY_MARKER, timeout=600)
    t = time.perf_counter()
    driver.wait_off(handle, timeout=60)
    return t


def run_network(prov: Provisioner, n: int, rep: int) -> tuple[float, list[float], int]:
    """Provision n nodes and boot them from their NBD exports; return (ready s, clone+export ms, bytes)."""
    names = [f"net{rep}-{i}" for i in range(n)]
    before = qsd_rchar(prov)
    t0 = time.perf_counter()
    ms = []
    for name in names:
        t = time.perf_counter()
        prov.provision("bench", name, "golden", ExportKind.NBD)
        ms.append((time.perf_counter() - t) * 1e3)
    handles = [prov.power_on("bench", name) for name in names]
    driver = QemuPower()
    ready = max(wait_ready(driver, h) for h in handles) - t0
    moved = qsd_rchar(prov) - before
    for name in names:
        prov.release("bench", name)
    return ready, ms, moved


def run_copy(prov: Provisioner, golden_uri: str, n: int, rep: int, tmp: Path) -> tuple[float, float, int]:
    """Copy the image to n local disks over the link, then boot each; return (ready s, boot s, bytes)."""
    driver = QemuPower()
    before = qsd_rchar(prov)
    done: list[float] = []
    boots: list[float] = []
    params = prov.node_power("bench", "template")[1].params

    def one(i: int) -> None:
        local = tmp / f"local{rep}-{i}.raw"
        subprocess.run(["nbdcopy", "--flush", golden_uri, str(local)], check=True)
        handle = NodeHandle(f"copy{rep}-{i}", f"52:54:00:cc:{rep:02x}:{i:02x}", str(local), tmp / "run", params)
        tb = time.perf_counter()
        driver.on(handle)
        t = wait_ready(driver, handle)
        boots.append(t - tb)
        done.append(t)
        local.unlink()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if len(done) != n:
        raise RuntimeError("a copy-then-boot node failed")
    return max(done) - t0, statistics.median(boots), qsd_rchar(prov) - before


def setup(cfg: BenchConfig, tmp: Path) -> tuple[Provisioner, str, int]:
    kernel = find_guest_kernel()
    initrd = build_initramfs(tmp / "initrd.gz", kernel)
    golden = build_golden_image(tmp / "golden.raw", label="bench", size_mib=cfg.image_mib, fill_mib=cfg.fill_mib)
    allocated = golden.stat().st_blocks * 512
    pcfg = ProvisionConfig(
        state_dir=tmp / "state",
        nbd_port=free_port(),
        iscsi_port=free_port(),
        http_port=free_port(),
        link_rate_bps=cfg.link_mbit * 1_000_000 // 8,
    )
    prov = Provisioner(pcfg)
    prov.create_project("bench")
    prov.import_image("bench", "golden", golden)
    golden.unlink()
    params = {"kernel": str(kernel.vmlinuz), "initrd": str(initrd)}
    prov.add_node("bench", "template", "52:54:00:cc:ff:ff", params=params)
    for rep in range(cfg.reps):
        for i in range(max(cfg.nodes)):
            prov.add_node("bench", f"net{rep}-{i}", f"52:54:00:dd:{rep:02x}:{i:02x}", params=params)
    qsd = prov.exports.qsd
    qsd.ensure_running()
    image_path = prov.images.image_path("bench", "golden", "raw")
    qsd.add_disk("golden-ro", image_path, fmt="raw", read_only=True)
    qsd.export_nbd("golden-ro", "golden-ro", writable=False)
    return prov, f"nbd://127.0.0.1:{pcfg.nbd_port}/golden-ro", allocated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB image, 1 rep (smoke test; no record)")
    ap.add_argument("--name", default="infra_provision_ready", help="the record's name")
    ap.add_argument("--notes", default="", help="added to the record's notes (e.g. how loaded the machine was)")
    args = ap.parse_args()
    cfg = BenchConfig(image_mib=128, fill_mib=32, reps=1) if args.quick else BenchConfig()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="carina-bench-provision-"))
    prov, golden_uri, allocated = setup(cfg, tmp)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for n in cfg.nodes:
            r = results.setdefault(
                str(n),
                {
                    "network_s": [],
                    "copy_s": [],
                    "clone_export_ms": [],
                    "boot_local_s": [],
                    "network_bytes": [],
                    "copy_bytes": [],
                },
            )
            for rep in range(cfg.reps):
                ready, ms, moved = run_network(prov, n, rep)
                r["network_s"].append(ready)
                r["clone_export_ms"] += ms
                r["network_bytes"].append(moved / n)
                ready, boot, moved = run_copy(prov, golden_uri, n, rep, tmp)
                r["copy_s"].append(ready)
                r["boot_local_s"].append(boot)
                r["copy_bytes"].append(moved / n)
                print(f"N={n} rep={rep}: network {r['network_s'][-1]:.2f} s, copy {ready:.2f} s", file=sys.stderr)
    finally:
        prov.close(stop_daemons=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.quick:
        print(results)
        return
    write_record(record(cfg, results, allocated, [load_before, os.getloadavg()], name=args.name, notes=args.notes))


def environment() -> dict[str, object]:
    """``carina doctor``'s report with this checkout's absolute paths made relative."""
    from carina.core.doctor import collect
    from carina.core.progress import to_jsonable

    root = str(Path(__file__).resolve().parents[2]) + "/"

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value.replace(root, "") if isinstance(value, str) else value

    return strip(to_jsonable(collect(paths=())))  # type: ignore[return-value]


def record(
    cfg: BenchConfig,
    results: dict[str, dict[str, list[float]]],
    allocated: int,
    load: list[tuple[float, ...]],
    *,
    name: str = "infra_provision_ready",
    notes: str = "",
) -> dict[str, object]:
    med = statistics.median
    figures = [
        Figure(
            name="clone_export_ms",
            value=med([ms for r in results.values() for ms in r["clone_export_ms"]]),
            unit="ms",
            higher_is_better=False,
            ceiling=50.0,
            ceiling_source="issue goal (<= 50 ms), not a physical limit",
        ),
    ]
    for n, r in results.items():
        figures.append(
            Figure(
                name=f"ready_s_{n}node",
                value=med(r["network_s"]),
                unit="s",
                higher_is_better=False,
                ceiling=med(r["boot_local_s"]),
                ceiling_source="boot from an already-local disk, same run",
                peers={"copy-then-boot (nbdcopy --flush)": med(r["copy_s"])},
            )
        )
    one = results["1"]
    figures.append(
        Figure(
            name="boot_read_fraction",
            value=100 * med(one["network_bytes"]) / allocated,
            unit="% of image",
            higher_is_better=False,
            ceiling=1.0,
            ceiling_source="issue goal (<= 1% of the image)",
            peers={"copy-then-boot": 100 * med(one["copy_bytes"]) / allocated},
        )
    )
    return make_record(
        name=name,
        environment=environment(),
        figures=figures,
        config=cfg,
        metrics={
            "raw": results,
            "image_allocated_bytes": allocated,
            "cpus": os.cpu_count(),
            "loadavg_before_after": load,
        },
        notes=(
            "TCG guests on a 2-core CPU machine; link modelled by one qemu-storage-daemon throttle group "
            "shared by all exports; bytes = storage daemon rchar delta per node (includes NBD headers)."
            + (f" {notes}" if notes else "")
        ),
    )


if __name__ == "__main__":
    main()
