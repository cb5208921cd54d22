"""Scan a running QEMU guest's disk from outside vs with an in-guest agent, while a workload runs.

The guest is the provisioning tests' kernel + busybox initramfs (see
:mod:`carina.testing.provision`) with its own ``/init``: it mounts its virtio
disk (an ext4 of a fake Debian tree with filler files, in qcow2) and runs a
workload (drop the page cache, read and ``md5sum`` every filler file, append
a line to a log on the disk) in four phases of ``iters`` iterations, printing
each iteration's time from ``/proc/uptime`` (10 ms ticks) on the serial console:

* ``A`` workload alone (before each of the other phases, so drift from a
  shared machine hits every phase alike);
* ``B`` workload while an *agent-style* scan loops inside the guest (busybox
  doing a scan's work: walk every inode testing setuid/world-writable modes,
  read the package database, accounts and sshd configuration);
* ``C`` workload while the host scans from outside: at the phase marker the
  host takes a QMP ``blockdev-snapshot-sync`` (new writes go to an overlay, the
  qcow2 under it is frozen and opened read-only by QEMU) and runs carina's
  full scan of the frozen image in a loop until the phase ends;

The sequence ``A B A C`` repeats ``rounds`` times; each ``C`` snapshots again,
so from the second round on carina scans the top of a growing qcow2 chain.

Nothing here asserts timings; :func:`run_experiment` returns them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing as mp
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.testing.introspect import FakeDebian, write_tree
from carina.testing.provision import GuestKernel, module_chain, newc_archive

__all__ = ["LiveResult", "Qmp", "build_guest", "run_experiment"]

_AGENT = """agent() {
  while true; do
    find /mnt -xdev \\( -perm -4000 -o -perm -2000 -o -perm -0002 \\) > /tmp/agent.out 2>/dev/null
    cat /mnt/var/lib/dpkg/status /mnt/etc/passwd /mnt/etc/group /mnt/etc/shadow /mnt/etc/ssh/sshd_config > /dev/null
    echo scan >> /tmp/agent.count
  done
}
"""

_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
for m in $(cat /modules.order); do insmod /lib/modules/$m.ko; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mount -t ext4 /dev/vda /mnt || { echo "LIVE-FAILED no disk"; poweroff -f; }
AGENT_FUNC
now() { cut -d' ' -f1 /proc/uptime | tr -d .; }
work() {
  echo 3 > /proc/sys/vm/drop_caches
  find /mnt/usr/share/filler -type f | xargs cat | md5sum > /dev/null
  echo "$1 $2" >> /mnt/var/log/work.log
}
r=0
while [ $r -lt ROUNDS ]; do
  for phase in A B A C; do
    echo "LIVE-PHASE $phase $r"
    [ $phase = C ] && read -t 120 go < /dev/ttyS1
    if [ $phase = B ]; then : > /tmp/agent.count; agent & apid=$!; renice -n NICE -p $apid > /dev/null; fi
    k=0
    while [ $k -lt ITERS ]; do
      t0=$(now); work $phase $k; t1=$(now)
      echo "LIVE-ITER $phase $k $((t1 - t0))"
      k=$((k + 1))
    done
    if [ $phase = B ]; then kill $apid; wait $apid 2>/dev/null; echo "LIVE-AGENT scans=$(wc -l < /tmp/agent.count)"; fi
  done
  r=$((r + 1))
done
echo "LIVE-PHASE E"
echo "LIVE-DONE"
umount /mnt; sync; poweroff -f
"""


def build_guest(
    work: Path, kernel: GuestKernel, *, iters: int, rounds: int, filler_files: int, filler_mb: int, nice: int = 0
) -> tuple[Path, Path, Path]:
    """The guest's initramfs, its qcow2 disk (a bare ext4 of a fake Debian tree) and that tree.

    ``nice`` is the in-guest agent's nice value (the workload runs at 0).
    """
    chain = module_chain(kernel.modules)
    d, f = 0o040755, 0o100000
    init = (
        _INIT.replace("AGENT_FUNC", _AGENT)
        .replace("ITERS", str(iters))
        .replace("ROUNDS", str(rounds))
        .replace("NICE", str(nice))
    )
    entries: list[tuple[str, int, bytes]] = [
        (n, d, b"") for n in ("bin", "dev", "proc", "sys", "mnt", "tmp", "lib", "lib/modules")
    ]
    entries += [("bin/busybox", f | 0o755, kernel.busybox.read_bytes()), ("init", f | 0o755, init.encode())]
    entries.append(("modules.order", f | 0o644, "\n".join(p.stem for p in chain).encode() + b"\n"))
    entries += [(f"lib/modules/{p.name}", f | 0o644, p.read_bytes()) for p in chain]
    initrd = work / f"live-initrd-{nice}.gz"
    initrd.write_bytes(gzip.compress(newc_archive(entries), compresslevel=1))
    root = write_tree(work / "live-root", FakeDebian(filler_files=filler_files, filler_bytes=filler_mb << 20))
    (root / "var/log").mkdir(parents=True, exist_ok=True)
    raw = work / "live.ext4"
    size = filler_mb * 2 + 64
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", str(root), str(raw), f"{size}M"], check=True)
    disk = work / "live.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(disk)], check=True)
    raw.unlink()
    return initrd, disk, root


class Qmp:
    """A minimal QMP client on a unix socket (greeting, capabilities, one command at a time)."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(str(path))
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.file = self.sock.makefile("rwb")
        self.file.readline()  # greeting
        self.command("qmp_capabilities")

    def command(self, name: str, **arguments: Any) -> Any:
        """Run one command; events in between are skipped. Raises RuntimeError on a QMP error."""
        self.file.write(json.dumps({"execute": name, "arguments": arguments}).encode() + b"\n")
        self.file.flush()
        while True:
            reply = json.loads(self.file.readline())
            if "return" in reply:
                return reply["return"]
            if "error" in reply:
                raise RuntimeError(f"QMP {name}: {reply['error']}")

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


@dataclass(kw_only=True)
class LiveResult:
    """Per-phase iteration times (ms) and what the host and the agent did."""

    iters: dict[str, list[int]] = field(default_factory=dict)
    agent_scans: list[int] = field(default_factory=list)
    host_scan_s: list[float] = field(default_factory=list)
    host_partial: int = 0
    snapshot_s: list[float] = field(default_factory=list)
    packages: list[set[tuple[str, str, str]]] = field(default_factory=list)
    frozen_changed: list[bool] = field(default_factory=list)
    accel: str = ""
    console: str = ""


def _scanner(image: Path, nice: int, stop: Any, out: Any) -> None:
    """Child process: carina's full scan (no rules) of ``image`` in a loop until ``stop`` is set."""
    from carina.security.introspect.scan import ScanConfig, scan_image

    os.nice(nice)
    while True:  # at least one scan per phase, however short
        t1 = time.perf_counter()
        report = scan_image(image, ScanConfig(rules="none"))
        inv = report.inventory
        pkgs = {(p.name, p.version, p.arch) for p in inv.packages if p.kind == "deb"} if inv else set()
        out.put((time.perf_counter() - t1, sorted(pkgs), report.partial))
        if stop.is_set():
            return


def _scan_until(res: LiveResult, image: Path, console: Path, markers: tuple[str, ...], nice: int) -> None:
    """Scan ``image`` from a child process at ``nice`` until the console shows one of ``markers``."""
    ctx = mp.get_context("fork")  # the parent has imported dissect already: the child starts at once
    stop, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_scanner, args=(image, nice, stop, out))
    child.start()
    while not any(m in console.read_text(errors="replace") for m in markers):
        time.sleep(0.02)
    stop.set()
    child.join(timeout=120)
    while not out.empty():
        seconds, pkgs, partial = out.get()
        res.host_scan_s.append(seconds)
        res.packages.append({tuple(p) for p in pkgs})
        res.host_partial += int(partial)


def _wait_for(console: Path, marker: str, timeout: float, also: str = "\0") -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = console.read_text(errors="replace")
        if marker in text or also in text:
            return text
        time.sleep(0.05)
    raise TimeoutError(f"guest did not print {marker!r}; console tail: {console.read_text()[-800:]!r}")


def run_experiment(
    work: Path,
    kernel: GuestKernel,
    initrd: Path,
    disk: Path,
    *,
    accel: str = "tcg",
    nice: int = 0,
    timeout: float = 600,
) -> LiveResult:
    """Boot the guest, scan its disk from the host (at ``nice``) in each phase C, collect the console's numbers."""
    from carina.security.introspect.scan import ScanConfig, scan_image

    scan_image(disk, ScanConfig(rules="none"))  # load dissect's lazy imports before the scanner forks

    console, qmp_path, go = work / "live-console.txt", work / "live-qmp.sock", work / "live-go.sock"
    console.write_text("")
    argv = [
        "qemu-system-x86_64", "-accel", accel, "-m", "512", "-smp", "1", "-nodefaults", "-display", "none",
        "-no-reboot", "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd),
        "-append", "console=ttyS0 quiet panic=-1", "-serial", f"file:{console}",
        "-serial", f"unix:{go},server=on,wait=off", "-qmp", f"unix:{qmp_path},server=on,wait=off",
        "-drive", f"file={disk},format=qcow2,if=virtio,id=disk0,cache=none,aio=threads",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    res = LiveResult(accel=accel)
    text = ""
    try:
        qmp = Qmp(qmp_path)
        frozen, r = disk, 0
        with socket.socket(socket.AF_UNIX) as go_sock:
            go_sock.connect(str(go))
            while True:
                text = _wait_for(console, f"LIVE-PHASE C {r}\n", timeout, also="LIVE-PHASE E")
                if f"LIVE-PHASE C {r}\n" not in text:
                    break
                overlay = work / f"live-overlay{r}.qcow2"
                t0 = time.perf_counter()
                qmp.command("blockdev-snapshot-sync", device="disk0", **{"snapshot-file": str(overlay)})
                res.snapshot_s.append(time.perf_counter() - t0)
                before = _sha(frozen)
                go_sock.sendall(b"go\n")  # release the guest into phase C
                _scan_until(res, frozen, console, (f"LIVE-PHASE A {r + 1}\n", "LIVE-PHASE E"), nice)
                res.frozen_changed.append(_sha(frozen) != before)
                frozen, r = overlay, r + 1
        text = _wait_for(console, "LIVE-DONE", timeout)
        proc.wait(timeout=60)
        qmp.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    res.console = text
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["LIVE-ITER"] and len(parts) == 4:
            res.iters.setdefault(parts[1], []).append(int(parts[3]) * 10)
        elif parts[:1] == ["LIVE-AGENT"]:
            res.agent_scans.append(int(parts[1].split("=")[1]))
    return res


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
