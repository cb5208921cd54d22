"""Out-of-core GNN training throughput against in-memory, host-gather, mmap and synchronous reads.

One run, one generated dataset, one model for every system:

* ``in-memory``   all features in device memory (the ideal, S0)
* ``host-gather`` features in pinned host memory, gathered and copied per batch (S1; GPU only)
* ``zero-copy``   the same pinned table mapped into the GPU; the GPU gathers rows over PCIe (S1b, UVA; GPU only)
* ``mmap``        np.memmap of the feature file, page cache dropped first (S2, cold: ``make_cold``)
* ``sync-reads``  same static cache as carina, then one O_DIRECT pread per missing row, no overlap (S3)
* ``carina``      static cache + page-coalesced reads (one vectorised gather per batch) + pipeline (S4)

carina runs at several cache budgets (share of rows in device + host cache, 1/3 + 2/3), each with the
host path the cost model predicts faster (``--host-gather model``: the CPU gathers the host-cache hits on
the IO thread, or the device reads them in place); the peers and the alternatives to the model's choice
(read-gap 0 and 4x the planned gap, no pipelining) at the peer budget, then the pick again (``again``: in
lane_h200_s9 the first run at a budget read 14-23% slower than the later runs of the same batches), and at
100% cache the other host path. Order: in-memory, carina at the peer budget, mmap, sync-reads,
host-gather, zero-copy, the other budgets, the alternatives, in-memory again (a deadline cuts from the
end). A system that
raises (out of memory, a mapping the device refuses) is recorded under ``skipped`` with its error and
the run goes on. The cost model (calibrated
in the same run, or ``--machine``) predicts each carina run.

    python benchmarks/gnn/bench_outofcore.py --nodes 262144 --dim 128 --batches 12
    python benchmarks/gnn/bench_outofcore.py --preset igb-like --nodes 65536 --name gnn_outofcore_igb

Large runs: ``--features-from generator`` builds the in-memory and host-gather tables and fills the
caches from the generator on the device (the same bytes as ``features.bin``, checked on a sample
first), so only the systems under test read the file; ``--run-seconds`` time-boxes each system;
``--deadline-s`` skips what no longer fits and the record is rewritten after every system, so a
step killed by its timeout keeps what finished. ``--peer-seed-offset`` gives mmap and sync-reads
batches of their own (no shared disk cache with carina's); their rows are checked against the
generator instead of the in-memory run. ``--warm-read-batches N`` reads N batches' rows (batches of
their own seed) from the file before the first timed system, untimed (``metrics.warm_read``): on the
H200 in session 12 the first disk-bound run read slower than the same batches at the end.

Each run records its sampler thread's milliseconds a batch (``sample_cpu_ms``, ``lookup_cpu_ms``:
CPU time around queued work; ``sample_device_ms``, ``lookup_device_ms``: CUDA events on the
sampler's own stream, None on the CPU or with the sampler on the device's stream).

``--preset igb-like``: 1024-d fp32 features (one 4 KiB page per row), Chung-Lu power law with IGB-HOM's
average degree (3.87e9 / 2.693e8 = 14.4) and 19 classes; the exponent 2.3 is our assumption.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import os
import time
from pathlib import Path
from typing import Any

import torch
from outofcore_peers import (
    HostGather,
    MmapFeatures,
    SyncReadFeatures,
    ZeroCopy,
    generated_rows,
    generated_table,
    generator_fetch,
    measure,
    measure_boxed,
    warm_read,
)
from outofcore_record import write

from carina.gnn.cache import CacheConfig, HotnessSource, StaticCache
from carina.gnn.calibrate import calibrate_machine, profile_workload
from carina.gnn.costmodel import MachineSpec, Overlap, best_gap_pages, hit_rate, predict
from carina.gnn.dataset import Dataset, PrepareConfig, prepare
from carina.gnn.hostpath import HostGather as HostPath
from carina.gnn.runner import RunConfig, build_cache
from carina.gnn.store import OutOfCoreFeatures, StoreConfig
from carina.gnn.train import InMemoryFeatures, TrainConfig
from carina.io import IOConfig, IOEngine, make_cold, resident_fraction

PRESETS: dict[str, dict] = {
    "papers-like": {"dim": 128, "avg_degree": 15.0, "gamma": 2.1, "classes": 16},
    "igb-like": {"dim": 1024, "avg_degree": 14.4, "gamma": 2.3, "classes": 19},
}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/tmp/carina-gnn-bench"))
    ap.add_argument("--nodes", type=int, default=1 << 18)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--avg-degree", type=float, default=15.0)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budgets", default="0,0.05,0.2,0.5", help="total cache share; 1/3 on device, 2/3 host")
    ap.add_argument("--peer-budget", type=float, default=None, help="budget of peers/alternatives (default: middle)")
    ap.add_argument("--name", default="gnn_outofcore")
    ap.add_argument("--gap", default="auto", help="hole pages read through to merge IOs: auto (from calibration) or N")
    ap.add_argument("--deterministic", action="store_true", help="train under torch deterministic algorithms")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="dataset shape (overrides dim, degree)")
    ap.add_argument("--gamma", type=float, default=2.1, help="Chung-Lu power-law exponent")
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--machine", type=Path, default=None, help="MachineSpec JSON instead of calibrating here")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of mmap, sync-reads, host-gather, zero-copy, ablations, one-stream to leave out",
    )
    ap.add_argument("--workload-out", type=Path, default=None, help="write the profiled workload JSON here")
    ap.add_argument("--features-from", choices=["file", "generator"], default="file")
    ap.add_argument("--run-seconds", type=float, default=0.0, help="time box of each system's epoch (0: none)")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="stop starting systems past this (0: none)")
    ap.add_argument("--peer-seed-offset", type=int, default=0, help="sampler seed offset of mmap and sync-reads")
    ap.add_argument(
        "--warm-read-batches",
        type=int,
        default=0,
        help="read this many batches' features (batches of their own) before the first timed system, untimed",
    )
    ap.add_argument(
        "--host-gather",
        choices=["model", "auto", "cpu", "device"],
        default="model",
        help="host path of carina's runs: the model's faster one, or as given (StoreConfig.host_gather)",
    )
    args = ap.parse_args()
    for k, v in PRESETS.get(args.preset or "", {}).items():
        setattr(args, k, v)
    return args


class Bench:
    """The state of one benchmark run; :meth:`save` writes what is done so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.t0 = args, time.perf_counter()
        self.skipped: dict[str, str] = {}
        self.results: dict[str, dict] = {}
        self.carina: dict[float, dict] = {}
        self.ablations: dict[str, dict] = {}
        self.extra: dict[str, Any] = {}
        self._caches: dict[float, StaticCache] = {}
        if not (args.data / "manifest.json").is_file():
            cfg = PrepareConfig(
                num_nodes=args.nodes,
                feature_dim=args.dim,
                avg_degree=args.avg_degree,
                gamma=args.gamma,
                num_classes=args.classes,
                train_fraction=0.05,
            )
            prepare(cfg, args.data, device=args.device)
        self.ds = Dataset.open(args.data)
        # the topology moves to the sampling device once: every sampler (profile, presample, each system's
        # epoch) then shares it instead of copying 4.5 GB at 2^26 nodes
        self.ds.graph = self.ds.graph.to(args.device)
        tc = TrainConfig(
            fanouts=[int(f) for f in args.fanouts.split(",")],
            batch_size=args.batch_size,
            hidden=args.hidden,
            max_batches=args.batches,
            deterministic=args.deterministic,
            time_limit_s=args.run_seconds,
        )
        self.cfg = RunConfig(train=tc, device=args.device)
        self.machine = (
            MachineSpec.load(args.machine)
            if args.machine
            else calibrate_machine(args.data, size_mb=128, device=args.device)
        )
        self.work = profile_workload(self.ds, self.cfg)
        if args.workload_out:
            args.workload_out.parent.mkdir(parents=True, exist_ok=True)
            self.work.save(args.workload_out)
        self.gap = best_gap_pages(self.machine) if args.gap == "auto" else int(args.gap)
        budgets = [float(b) for b in args.budgets.split(",")]
        self.budgets = budgets
        self.peer_budget = args.peer_budget if args.peer_budget is not None else budgets[len(budgets) // 2]
        self.skip = set(filter(None, args.skip.split(",")))

    def fits(self, name: str) -> bool:
        """Whether ``name`` may start: not skipped, and a time-boxed run still fits the deadline."""
        a = self.args
        if name in self.skip or name.split(" ", maxsplit=1)[0] in self.skip:
            self.skipped[name] = "--skip"
            return False
        left = a.deadline_s - (time.perf_counter() - self.t0) if a.deadline_s else float("inf")
        if left < 1.5 * a.run_seconds + 5:
            self.skipped[name] = f"deadline: {left:.0f} s left"
            return False
        return True

    def save(self) -> None:
        self.extra["elapsed_s"] = time.perf_counter() - self.t0
        write(self)

    def feature_check(self, eng: IOEngine) -> None:
        """With generated features standing in for the file, check a sample of the file first."""
        if self.args.features_from != "generator":
            return
        store = OutOfCoreFeatures(self.ds, engine=eng)
        ids = torch.randint(0, self.ds.manifest.num_nodes, (4096,), generator=torch.Generator().manual_seed(5))
        rows = store.read_rows(ids)
        store.close()
        same = torch.equal(rows, generated_rows(self.ds, ids, self.args.device).cpu())
        self.extra["file_matches_generator_on_4096_rows"] = same
        if not same:
            raise SystemExit("features.bin differs from the generator: --features-from generator is invalid here")

    def in_memory(self, key: str = "in-memory", *, sample_stream: bool = True) -> None:
        """The in-memory baseline; ``sample_stream=False``: its sampler on the device's stream (as before s11)."""
        if not self.fits(key):
            return
        a = self.args
        cfg = copy.deepcopy(self.cfg)
        cfg.train.sample_stream = sample_stream
        table = generated_table(self.ds, a.device) if a.features_from == "generator" else self.ds.read_all_features()
        self.results[key] = measure(self.ds, cfg, InMemoryFeatures(table, device=a.device), a.warmup)
        self.results[key]["sample_stream"] = sample_stream
        del table
        _free()
        self.save()

    def host_gather(self) -> None:
        a = self.args
        if not a.device.startswith("cuda"):
            self.skipped |= {"host-gather": "GPU only", "zero-copy": "GPU only"}
            return
        if not self.fits("host-gather"):
            return
        if a.features_from == "generator":
            host = generated_table(self.ds, a.device, out_device="cpu", pin=True)
        else:
            host = self.ds.read_all_features().pin_memory()
        self.results["host-gather"] = measure(self.ds, self.cfg, HostGather(host, a.device), a.warmup)
        self.save()
        if self.fits("zero-copy"):
            self.guard("zero-copy", functools.partial(self._zero_copy, host))
        del host
        _free()
        self.save()

    def _zero_copy(self, host: torch.Tensor) -> None:
        self.results["zero-copy"] = measure(self.ds, self.cfg, ZeroCopy(host, self.args.device), self.args.warmup)

    def guard(self, name: str, fn: Any) -> None:
        """Run one system; an error is recorded under ``skipped`` instead of ending the run."""
        try:
            fn()
        except Exception as exc:  # one failing system must not lose the others' results
            self.skipped[name] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            print(f"{name}: {self.skipped[name]}", flush=True)
            _free()
        self.save()

    def host_path(self, budget: float) -> HostPath:
        """The host path of carina at ``budget``: the one the model predicts faster, or ``--host-gather``."""
        if self.args.host_gather != "model":
            return HostPath(self.args.host_gather)
        if not self.machine.device_gather_priced:
            return HostPath.AUTO
        c = self.cache_config(budget)
        rows = {"gpu_cache_rows": c.gpu_rows, "host_cache_rows": c.host_rows, "gap_pages": self.gap}
        by_path = {
            h: predict(self.machine, self.work, host_gather=h, **rows).batch_s for h in (HostPath.CPU, HostPath.DEVICE)
        }
        return min((HostPath.CPU, HostPath.DEVICE), key=lambda h: by_path[h])

    def cache_config(self, budget: float) -> CacheConfig:
        """The static cache of ``budget`` (a share of the rows): 1/3 in the GPU slice, 2/3 in the host slice."""
        n = self.ds.manifest.num_nodes
        return CacheConfig(gpu_rows=int(budget / 3 * n), host_rows=int(2 * budget / 3 * n))

    def carina_run(self, eng: IOEngine, budget: float, store_cfg: StoreConfig, cfg: RunConfig | None = None) -> dict:
        a = self.args
        cfg = cfg or self.cfg
        cfg.cache = self.cache_config(budget)
        cfg.cache.hotness = HotnessSource.PRESAMPLE
        store = OutOfCoreFeatures(self.ds, engine=eng, device=cfg.device, config=store_cfg)
        t_fill = time.perf_counter()
        store.attach_cache(self.cache_at(budget, cfg, store))
        t_fill = time.perf_counter() - t_fill
        out = measure(self.ds, cfg, store, a.warmup, verify=a.features_from == "generator")
        overlap = Overlap.PIPELINED if cfg.train.pipeline_depth > 1 else Overlap.SERIAL
        path = store.host_path if self.machine.device_gather_priced else HostPath.CPU
        pred = predict(
            self.machine,
            self.work,
            gpu_cache_rows=cfg.cache.gpu_rows,
            host_cache_rows=cfg.cache.host_rows,
            overlap=overlap,
            gap_pages=store_cfg.gap_pages,
            host_gather=path,
        )
        out |= {
            "budget": budget,
            "host_gather": store.host_path.value,
            "fetch": store.stats.as_dict(self.ds.manifest.row_bytes),
            "cache_bytes": store.cache.nbytes if store.cache else {},
            "cache_fill_s": t_fill,
            "gap_pages": store_cfg.gap_pages,
            "pipeline_depth": cfg.train.pipeline_depth,
            "sample_stream": cfg.train.sample_stream,
            "predicted": {
                "seeds_per_s": pred.seeds_per_s,
                "bottleneck": pred.bottleneck,
                "stages": pred.stages,
                "lanes": pred.lanes,
                "host_gather": pred.host_gather,
                "batch_s": pred.batch_s,
                "disk_ios": pred.disk_ios,
                "disk_pages": pred.disk_pages,
            },
        }
        store.close()
        store.attach_cache(None)
        _free()
        return out

    def cache_at(self, budget: float, cfg: RunConfig, store: OutOfCoreFeatures) -> StaticCache:
        """The static cache of ``budget``; the peer budget's and 100%'s are built once and shared (carina,
        sync-reads and the alternatives run on the same rows: a static cache is read only)."""
        if budget in self._caches:
            return self._caches[budget]
        fetch = generator_fetch(self.ds, self.args.device) if self.args.features_from == "generator" else None
        cache = build_cache(self.ds, cfg, store, fetch=fetch)
        if budget in (self.peer_budget, 1.0):  # the alternatives and the other host path reuse them
            self._caches[budget] = cache
        return cache

    def peers(self, eng: IOEngine) -> None:
        a, b = self.args, self.peer_budget
        peer_cfg = RunConfig.from_dict(self.cfg.to_dict())
        peer_cfg.train.seed += a.peer_seed_offset
        if self.fits("mmap"):
            cold = make_cold(self.ds.features_path)
            rows = self.work.unique_per_batch
            run = measure_boxed(self.ds, peer_cfg, MmapFeatures(self.ds, a.device), a.warmup, rows)
            run["cold"] = cold | {"resident_after_run": resident_fraction(self.ds.features_path)}
            self.results["mmap"] = run
            self.save()
        if self.fits("sync-reads"):
            sync_cfg = RunConfig.from_dict(peer_cfg.to_dict())
            sync_cfg.train.pipeline_depth = 1
            sync_cfg.cache = self.cache_config(b)
            store = OutOfCoreFeatures(self.ds, engine=eng, device=a.device)
            store.attach_cache(self.cache_at(b, sync_cfg, store))
            sync = SyncReadFeatures(store, self.ds.features_path)
            rows = self.work.unique_per_batch * (1 - hit_rate(self.work.hotness_curve, b))
            run = measure_boxed(self.ds, sync_cfg, sync, a.warmup, rows)
            self.results["sync-reads"] = run | {"reads": sync.reads, "budget": b}
            sync.close()
            store.close()
            _free()
            self.save()

    def _alternative(self, eng: IOEngine, name: str, budget: float, store_cfg: StoreConfig, cfg: RunConfig) -> None:
        self.ablations[name] = self.carina_run(eng, budget, store_cfg, cfg)

    def store_cfg(self, budget: float, **over: Any) -> StoreConfig:
        """carina's page-read policy (the planned gap) and host path at ``budget``."""
        return StoreConfig(
            **({"gap_pages": self.gap, "max_run_pages": 256, "host_gather": self.host_path(budget)} | over)
        )

    def alternatives(self, eng: IOEngine) -> None:
        """The cost model's choice against the alternatives: at 100% cache the other host path, at the
        peer budget the gaps and pipelining, then the pick again."""
        b = self.peer_budget
        alts: dict[str, tuple[float, StoreConfig, int]] = {}
        if 1.0 in self.carina:  # first: a deadline cuts from the end
            ran = HostPath(self.carina[1.0]["host_gather"])
            other = HostPath.CPU if ran is HostPath.DEVICE else HostPath.DEVICE
            alts[f"host-gather {other.value}@1"] = (1.0, self.store_cfg(1.0, host_gather=other), 3)
        alts |= {
            "no-hole-coalescing": (b, self.store_cfg(b, gap_pages=0), 3),
            "gap x4": (b, self.store_cfg(b, gap_pages=max(1, 4 * self.gap)), 3),
            "no-pipelining": (b, self.store_cfg(b), 1),
            "again": (b, self.store_cfg(b), 3),
        }
        for name, (budget, store_cfg, depth) in alts.items():
            if not self.fits(f"ablations {name}"):
                continue
            cfg = RunConfig.from_dict(self.cfg.to_dict())
            cfg.train.pipeline_depth = depth
            run = functools.partial(self._alternative, eng, name, budget, store_cfg, cfg)
            self.guard(f"ablations {name}", run)
            self.save()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:  # pinned blocks go back to the OS, not the caching allocator
            empty_host()


def main() -> None:
    bench = Bench(parse())
    with IOEngine(IOConfig(queue_depth=128, workers=8)) as eng:
        # priority order: a deadline cuts the tail, so the comparisons the issue asks for come first
        bench.feature_check(eng)
        if bench.args.warm_read_batches > 0:  # the disk's ramp before the first timed system (metrics.warm_read)
            bench.extra["warm_read"] = warm_read(bench.ds, bench.cfg, eng, bench.args.warm_read_batches)
            bench.save()
        bench.guard("in-memory", bench.in_memory)
        if "one-stream" not in bench.skip and bench.args.device.startswith("cuda"):
            bench.guard("in-memory one-stream", lambda: bench.in_memory("in-memory one-stream", sample_stream=False))
        pb = bench.peer_budget
        order = [pb, *(b for b in bench.budgets if b != pb)]

        def carina_at(b: float) -> None:
            bench.carina[b] = bench.carina_run(eng, b, bench.store_cfg(b))

        for b in order[:1]:
            if bench.fits(f"carina@{b:g}"):
                bench.guard(f"carina@{b:g}", lambda b=b: carina_at(b))
        bench.guard("peers", lambda: bench.peers(eng))
        bench.guard("host-gather", bench.host_gather)
        for b in order[1:]:
            if bench.fits(f"carina@{b:g}"):
                bench.guard(f"carina@{b:g}", lambda b=b: carina_at(b))
        if "ablations" not in bench.skip:
            bench.guard("ablations", lambda: bench.alternatives(eng))
        bench._caches.clear()  # the shared peer-budget cache goes before the last in-memory table
        _free()
    # on a shared machine the load drifts; the better one is the ceiling
    bench.guard("in-memory again", lambda: bench.in_memory("in-memory again"))
    bench.extra["loadavg_at_end"] = os.getloadavg()
    bench.save()
    print(f"done in {time.perf_counter() - bench.t0:.0f} s; skipped: {bench.skipped or 'nothing'}")


if __name__ == "__main__":
    main()
