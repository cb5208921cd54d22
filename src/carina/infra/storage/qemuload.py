"""The tier end to end with qemu-img as the client: for machines without fio or libnbd.

``qemu-img`` carries its own NBD client (no libnbd), so a handful of Debian
packages unpacked into a private prefix make it run where nothing can be
installed. Per block size ``B`` (also each tier's block size), every system is
started at once, then each client load runs on every system in turn (order
rotated per round, so drifting load hits all alike):

* ``fill``: ``qemu-img convert -n -m 16 -W`` writes the data set (16 requests in
  flight, qemu-img's most; up to 2 MiB each, out of order), then ``qemu-img
  compare`` reads the export back against it (``fill_verified``: 1.0 = bit-exact);
* ``read``: ``qemu-img bench -d 32 -s B`` reads the filled export at queue depth
  32 (sequential offsets, wrapping), sized to run about ``seconds``;
* ``write_const``: ``qemu-img bench -w -d 32 -s B``, queue depth 32; its payload
  is qemu-img's constant pattern byte, not the data set (so zlib shrinks it to
  almost nothing and ZVC not at all: quote it as that, not as realistic writes).

Server CPU-seconds come from ``/proc`` for each server's process tree, so
every figure has its CPU cost per GB next to it::

    rows = run_qemu_load(QemuLoadConfig(systems=["torch", "inline"], blocks=[65536]), data, work=Path("w"))
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core.config import Config, require
from carina.core.errors import BackendUnavailable
from carina.infra.storage.loadtest import cpu_seconds, split_system

__all__ = ["QEMU_SYSTEMS", "QemuLoadConfig", "run_qemu_load"]

log = logging.getLogger("carina.infra.storage")

#: System -> (engine, codec); ``cpu`` means the config's CPU codec.
QEMU_SYSTEMS = {"torch": ("torch", "zvc"), "nvcomp": ("nvcomp", "cpu"), "inline": ("inline", "cpu"),
                "thread": ("thread", "cpu"), "process": ("process", "cpu"), "forward": ("inline", "raw"),
                "torch-bsync": ("torch", "zvc"), "nvcomp-bsync": ("nvcomp", "cpu")}  # fmt: skip
_GPU = ("torch", "nvcomp", "torch-bsync", "nvcomp-bsync")  # -bsync: launch threads wait by blocking sync


@dataclass(kw_only=True)
class QemuLoadConfig(Config):
    """What the qemu-img load runs.

    Attributes:
        systems: Keys of :data:`QEMU_SYSTEMS`.
        blocks: Request sizes (each also the tier's block size).
        codec: Codec of the CPU systems.
        workers: Workers of the ``thread``/``process`` systems.
        gpu_workers: Launch threads (CUDA streams) of the ``torch`` and ``nvcomp`` systems.
        device: Torch device of the ``torch`` and ``nvcomp`` systems.
        seconds: Target length of each bench run.
        rounds: Rounds of every load on every system (medians reported).
        qemu_img: The qemu-img executable.
        clients: qemu-img processes (one connection each) per load, sharing queue depth 32 (reads, writes)
            or each filling its own slice of the export (16 in flight each); a system named ``<system>-fe<N>``
            runs ``N`` front-end processes, which need as many clients to be busy.
        server_cpus: ``taskset -c`` list every server (its front ends, workers and threads) is pinned to,
            the same cores for every system (``""``: not pinned).
        client_cpus: ``taskset -c`` list of the qemu-img clients (``""``: not pinned).
    """

    systems: list[str] = field(default_factory=lambda: ["torch", "inline", "thread", "forward"])
    blocks: list[int] = field(default_factory=lambda: [4 << 10, 64 << 10])
    codec: str = "zlib"
    workers: int = 8
    gpu_workers: int = 2
    device: str = "auto"
    seconds: float = 1.0
    rounds: int = 1
    qemu_img: str = "qemu-img"
    clients: int = 1
    server_cpus: str = ""
    client_cpus: str = ""

    def validate(self) -> None:
        """Check names and ranges."""
        known = all(split_system(s, QEMU_SYSTEMS)[0] in QEMU_SYSTEMS for s in self.systems)
        require(known, f"systems must be among {sorted(QEMU_SYSTEMS)} (optionally -fe<N>)", key="systems")
        require(1 <= self.clients <= 32 and 32 % self.clients == 0, "clients must divide 32", key="clients")
        require(all(b >= 512 and b & (b - 1) == 0 for b in self.blocks), "blocks: powers of two >= 512", key="blocks")
        require(self.seconds > 0 and self.rounds > 0, "seconds and rounds must be positive", key="seconds")


@dataclass
class _Server:
    system: str
    block: int
    proc: subprocess.Popen[str]
    store: Path
    url: str = ""
    stopped: bool = False


def _pin(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def _start(cfg: QemuLoadConfig, system: str, block: int, size: int, work: Path) -> _Server:
    base, frontends = split_system(system, QEMU_SYSTEMS)
    engine, codec = QEMU_SYSTEMS[base]
    store = work / f"store-{system}-{block}"
    shutil.rmtree(store, ignore_errors=True)
    cmd = [*_pin(cfg.server_cpus), sys.executable, "-m", "carina", "storage", "serve", "--json", "--port", "0",
           "--store", str(store),
           "--size", str(size), "--block-size", str(block), "--engine", engine,
           "--codec", cfg.codec if codec == "cpu" else codec, "--device", cfg.device,
           "--workers", str(cfg.gpu_workers if base in _GPU else cfg.workers), "--frontends", str(frontends),
           "--slots", "64", "--stats-interval", "3600",
           "--cuda-wait", "block" if base.endswith("-bsync") else "spin"]  # fmt: skip
    return _Server(system, block, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                   store)  # fmt: skip


def _ready(server: _Server) -> None:
    line = server.proc.stdout.readline() if server.proc.stdout else ""
    if not line:
        raise BackendUnavailable(f"carina storage serve ({server.system}) did not start: "
                                 f"{server.proc.communicate()[1][-1500:]}")  # fmt: skip
    server.url = json.loads(line)["url"]


def _stop(server: _Server) -> dict[str, Any]:
    """Stop the server; its final stats (``{}`` when it printed none)."""
    if server.stopped:
        return {}
    server.stopped = True
    server.proc.terminate()
    try:
        out, _ = server.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        out, _ = server.proc.communicate()
    for line in reversed((out or "").splitlines()):
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "stopped":
                return dict(event)
    return {}


def _timed(server: _Server, cmds: list[list[str]], cpus: str = "") -> tuple[float, float, list[str]]:
    """Run client commands side by side; the wall seconds, the server's CPU-seconds meanwhile, each stdout."""
    c0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
    procs = [subprocess.Popen([*_pin(cpus), *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in cmds]  # fmt: skip
    outs = [proc.communicate() for proc in procs]
    wall, cpu = time.perf_counter() - t0, cpu_seconds(server.proc.pid) - c0
    for proc, (_, err) in zip(procs, outs, strict=True):
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, stderr=err)
    return wall, cpu, [out for out, _ in outs]


def _bench(cfg: QemuLoadConfig, server: _Server, *, write: bool, size: int) -> dict[str, float]:
    """``qemu-img bench`` at queue depth 32, rerun once with a count scaled to about ``cfg.seconds``."""
    b, n = server.block, cfg.clients
    count = max(256, (16 << 20) // b // n)
    for _ in range(2):
        cmd = [cfg.qemu_img, "bench", "-f", "raw", "-d", str(32 // n), "-s", str(b), "-c", str(count),
               *(["-w"] if write else [])]  # fmt: skip
        # each client starts at its own slice (-o; offsets wrap at the end), so n clients read different blocks
        starts = [k * size // n // b * b for k in range(n)]
        wall, cpu, outs = _timed(server, [[*cmd, "-o", str(at), server.url] for at in starts],
                                 cfg.client_cpus)  # fmt: skip
        took = [re.search(r"Run completed in ([0-9.]+) seconds", out) for out in outs]
        secs = max(float(m.group(1)) for m in took) if all(took) else wall  # type: ignore[union-attr]
        if secs >= 0.5 * cfg.seconds:
            break
        count = min(int(count * cfg.seconds / max(secs, 1e-3)), max(count, (4 << 30) // b // n))
    nbytes = n * count * b
    return {"mb_s": nbytes / secs / 1e6, "cpu_s_per_gb": cpu / (nbytes / 1e9), "requests": float(count)}


def _fill_commands(cfg: QemuLoadConfig, server: _Server, image: Path) -> list[list[str]]:
    """One ``qemu-img convert`` per client, each writing its own slice of the export (one: the whole image)."""
    nbytes = image.stat().st_size
    if cfg.clients == 1:
        return [[cfg.qemu_img, "convert", "-n", "-m", "16", "-W", "-f", "raw", "-O", "raw", str(image), server.url]]
    m = re.match(r"nbd://([^:/]+):(\d+)/(.*)", server.url)
    assert m is not None, server.url
    host, port, export = m.groups()
    step = -(-nbytes // cfg.clients // server.block) * server.block
    cmds = []
    for lo in range(0, nbytes, step):
        span = f"offset={lo},size={min(step, nbytes - lo)}"
        cmds.append([cfg.qemu_img, "convert", "-n", "-m", "16", "-W",
                     "--image-opts", f"driver=raw,{span},file.driver=file,file.filename={image}",
                     "--target-image-opts", f"driver=raw,{span},file.driver=nbd,file.server.type=inet,"
                     f"file.server.host={host},file.server.port={port},file.export={export}"])  # fmt: skip
    return cmds


def _fill(cfg: QemuLoadConfig, server: _Server, image: Path) -> dict[str, float]:
    wall, cpu, _ = _timed(server, _fill_commands(cfg, server, image), cfg.client_cpus)
    nbytes = image.stat().st_size
    from carina.infra.storage.store import read_store_summary

    same = subprocess.run([cfg.qemu_img, "compare", "-q", "-f", "raw", "-F", "raw", str(image), server.url],
                          capture_output=True, text=True)  # fmt: skip
    ratio = float(read_store_summary(server.store)["ratio"])
    return {"mb_s": nbytes / wall / 1e6, "cpu_s_per_gb": cpu / (nbytes / 1e9), "ratio": ratio,
            "verified": float(same.returncode == 0)}  # fmt: skip


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _load_block(cfg: QemuLoadConfig, servers: list[_Server], image: Path) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for s in servers:
        rows[s.system] = {
            "system": s.system,
            "block": s.block,
            **{f"fill_{k}": v for k, v in _fill(cfg, s, image).items()},
        }
    for op in ("read", "write_const"):
        runs: dict[str, list[dict[str, float]]] = {s.system: [] for s in servers}
        for k in range(cfg.rounds):
            for s in servers[k % len(servers) :] + servers[: k % len(servers)]:
                runs[s.system].append(_bench(cfg, s, write=op != "read", size=image.stat().st_size))
        for system, got in runs.items():
            for key in ("mb_s", "cpu_s_per_gb"):
                rows[system][f"{op}_{key}"] = _median([r[key] for r in got])
            rows[system][f"{op}_mb_s_runs"] = [round(r["mb_s"], 2) for r in got]
    return list(rows.values())


def step_times(ends: list[dict[str, Any]], batches: int) -> dict[str, float]:
    """A GPU engine's host time per batch by step (:mod:`.stepclock`), over all front ends and loads.

    ``step_<name>_wall_us`` and ``step_<name>_cpu_us``: the step's wall and launch-thread CPU microseconds, summed
    over the front ends' reports and divided by their batches (``{}`` for engines that time no steps).
    """
    names = sorted({k[len("engine_step_") : -len("_wall_s")] for f in ends for k in f
                    if k.startswith("engine_step_") and k.endswith("_wall_s")})  # fmt: skip
    out = {}
    for name in names:
        for kind in ("wall", "cpu"):
            total = sum(float(f.get(f"engine_step_{name}_{kind}_s", 0.0)) for f in ends)
            out[f"step_{name}_{kind}_us"] = total / max(batches, 1) * 1e6
    return out


def run_qemu_load(cfg: QemuLoadConfig, image: Path, *, work: Path, on_block: Any = None) -> list[dict[str, Any]]:
    """Every system at every block size (all servers started at once); one row per system and block.

    ``on_block(rows_so_far)`` is called after each block size, so a caller can
    write what has finished before a later block size runs out of time.
    """
    if shutil.which(cfg.qemu_img) is None:
        raise BackendUnavailable(f"{cfg.qemu_img} is not installed (apt-get install qemu-utils)")
    size = image.stat().st_size
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        servers = [_start(cfg, s, b, size, work) for b in cfg.blocks for s in cfg.systems]
        for server in servers:
            stack.callback(_stop, server)
        for server in list(servers):
            try:
                _ready(server)
            except BackendUnavailable as exc:  # one system that cannot start must not cost the others' rows
                log.warning("%s: %s, left out", server.system, exc)
                servers.remove(server)
        for block in cfg.blocks:
            these = [s for s in servers if s.block == block]
            got = _load_block(cfg, these, image)
            for server, row in zip(these, got, strict=True):  # the engine's batching over all loads of the block
                final = _stop(server)
                ends = final.get("frontends") or [final]  # -fe<N>: one final per front end
                jobs, batches = (sum(f.get(k, 0) for f in ends) for k in ("engine_jobs", "engine_batches"))
                row["engine_jobs_per_batch"] = jobs / max(batches, 1)
                # warm-up before "ready", outside every timed load (the slowest front end's)
                row["engine_prepare_s"] = max(float(f.get("engine_prepare_s", 0.0)) for f in ends)
                row.update(step_times(ends, batches))
            rows += got
            if on_block is not None:
                on_block(rows)
    return rows
