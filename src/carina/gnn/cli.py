"""``carina gnn``: prepare datasets, train out of core, calibrate, plan, topology, placement.

Commands import torch (and networkx/scipy) inside their bodies, so
``carina gnn --help`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from carina.core.progress import emit_json, print_table, progress

app = typer.Typer(help="Out-of-core GNN training, cost model and GPU placement.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
DeviceOpt = Annotated[str, typer.Option(help="Compute/sampling device: cpu or cuda.")]
FanoutOpt = Annotated[str, typer.Option(help="Neighbours per hop, comma separated.")]


def _fanouts(text: str) -> list[int]:
    from carina.core.errors import ConfigError

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"fanouts must be comma-separated integers, got {text!r}", key="fanouts") from None


@app.command()
def prepare(
    out: Annotated[Path, typer.Argument(help="Dataset directory to write.")],
    nodes: Annotated[int, typer.Option(help="Number of nodes.")] = 1 << 16,
    avg_degree: Annotated[float, typer.Option(help="Mean in-degree.")] = 15.0,
    gamma: Annotated[float, typer.Option(help="Power-law exponent (chung-lu).")] = 2.1,
    generator: Annotated[str, typer.Option(help="chung-lu or rmat.")] = "chung-lu",
    dim: Annotated[int, typer.Option(help="Feature width.")] = 128,
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    classes: Annotated[int, typer.Option(help="Number of classes.")] = 16,
    train_fraction: Annotated[float, typer.Option(help="Share of nodes that are training seeds.")] = 0.01,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
    device: DeviceOpt = "cpu",
    json_out: JsonOpt = False,
) -> None:
    """Generate a power-law graph with id-derived features into a dataset directory."""
    from carina.core.config import choice
    from carina.gnn.dataset import GeneratorKind, PrepareConfig
    from carina.gnn.dataset import prepare as do_prepare

    cfg = PrepareConfig(
        num_nodes=nodes,
        avg_degree=avg_degree,
        gamma=gamma,
        generator=choice(GeneratorKind, generator, key="generator"),
        feature_dim=dim,
        dtype=dtype,
        num_classes=classes,
        train_fraction=train_fraction,
        seed=seed,
        name=out.name,
    )
    ds = do_prepare(cfg, out, device=device)
    info = ds.manifest.to_dict() | {"path": str(out), "train_nodes": int(ds.train_idx.numel())}
    if json_out:
        emit_json(info)
    else:
        print_table([(k, v) for k, v in info.items() if k != "source"], columns=["field", "value"], title="dataset")


@app.command()
def train(
    dataset: Annotated[Path, typer.Argument(help="Dataset directory (carina gnn prepare).")],
    device: DeviceOpt = "cpu",
    model: Annotated[str, typer.Option(help="sage or gcn.")] = "sage",
    fanouts: FanoutOpt = "25,10",
    batch_size: Annotated[int, typer.Option(help="Seeds per batch.")] = 1024,
    hidden: Annotated[int, typer.Option(help="Hidden width.")] = 256,
    gpu_cache: Annotated[float, typer.Option(help="Share of rows cached on the device (0..1).")] = 0.05,
    host_cache: Annotated[float, typer.Option(help="Share of rows cached in host memory (0..1).")] = 0.1,
    hotness: Annotated[str, typer.Option(help="presample or degree.")] = "presample",
    depth: Annotated[int, typer.Option(help="Batches in flight (1 = serial).")] = 3,
    host_gather: Annotated[
        str, typer.Option(help="Who gathers host-cache hits: auto, cpu (IO thread) or device (GPU, in place).")
    ] = "auto",
    max_batches: Annotated[int, typer.Option(help="Stop after this many batches (0 = epoch).")] = 0,
    compare: Annotated[str, typer.Option(help="in-memory or none: baseline in the same run.")] = "in-memory",
    deterministic: Annotated[bool, typer.Option(help="Deterministic torch algorithms (bitwise on CUDA).")] = False,
    sample_stream: Annotated[
        bool, typer.Option(help="On CUDA, sample and plan on a stream of their own (not behind the step).")
    ] = True,
    json_out: JsonOpt = False,
) -> None:
    """Train GraphSAGE/GCN with features on disk; compare with all features in memory."""
    from carina.core.config import choice
    from carina.gnn.cache import CacheConfig, HotnessSource
    from carina.gnn.dataset import Dataset
    from carina.gnn.hostpath import HostGather
    from carina.gnn.runner import Compare, RunConfig, run_training
    from carina.gnn.store import StoreConfig
    from carina.gnn.train import ModelKind, TrainConfig

    train_cfg = TrainConfig(
        model=choice(ModelKind, model, key="model"),
        fanouts=_fanouts(fanouts),
        batch_size=batch_size,
        hidden=hidden,
        pipeline_depth=depth,
        max_batches=max_batches,
        deterministic=deterministic,
        sample_stream=sample_stream,
    )
    source, baseline = choice(HotnessSource, hotness, key="hotness"), choice(Compare, compare, key="compare")
    store = StoreConfig(host_gather=choice(HostGather, host_gather, key="host_gather"))
    ds = Dataset.open(dataset)
    n = ds.manifest.num_nodes
    cfg = RunConfig(
        train=train_cfg,
        cache=CacheConfig(gpu_rows=int(gpu_cache * n), host_rows=int(host_cache * n), hotness=source),
        store=store,
        device=device,
        compare=baseline,
    )
    total = max_batches or -(-ds.train_idx.numel() // batch_size)
    with progress() as bar:
        task = bar.add_task("training (out of core)", total=total)
        report = run_training(ds, cfg, on_batch=lambda i, loss: bar.update(task, completed=i))
    _show_report(report, ds.manifest.row_bytes, json_out)


def _show_report(report: Any, row_bytes: int, json_out: bool) -> None:
    from dataclasses import asdict

    if json_out:
        emit_json(asdict(report))
        return
    ooc, mem = report.out_of_core, report.in_memory
    rows = [("out-of-core", f"{ooc['seeds_per_s']:.0f}", f"{ooc['wall_s']:.2f}", f"{ooc['losses'][-1]:.4f}")]
    if mem:
        rows.append(("in-memory", f"{mem['seeds_per_s']:.0f}", f"{mem['wall_s']:.2f}", f"{mem['losses'][-1]:.4f}"))
    print_table(rows, columns=["system", "seeds/s", "wall s", "last loss"], title="training")
    f = report.fetch
    disk_gbps = f["bytes_read"] / ooc["wall_s"] / 1e9 if ooc["wall_s"] else 0.0
    stats = [
        ("cache hit rate", f"{f['hit_rate']:.1%}"),
        ("disk GB/s", f"{disk_gbps:.3f}"),
        ("IOs", int(f["ios"])),
        ("read amplification", f"{f['amplification']:.2f}"),
        ("O_DIRECT", report.direct_io),
        ("losses equal to in-memory", report.losses_equal),
        *((f"{k} s (total)", f"{v:.3f}") for k, v in ooc["stage_s"].items()),
        ("train s (total)", f"{ooc['train_s']:.3f}"),
    ]
    print_table(stats, columns=["metric", "value"], title="out-of-core pipeline")


@app.command()
def calibrate(
    scratch: Annotated[Path, typer.Argument(help="Directory on the disk that will hold features.")],
    device: DeviceOpt = "cpu",
    size_mb: Annotated[int, typer.Option(help="Scratch file size for disk tests.")] = 256,
    queue_depth: Annotated[int, typer.Option(help="Reads in flight (bench_outofcore's engine: 128).")] = 128,
    out: Annotated[Path | None, typer.Option(help="Write the MachineSpec JSON here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure disk IOPS/bandwidth, host->device copies and gathers for the cost model."""
    from carina.gnn.calibrate import calibrate_machine
    from carina.io import IOConfig

    spec = calibrate_machine(scratch, size_mb=size_mb, device=device, io=IOConfig(queue_depth=queue_depth))
    if out is not None:
        spec.save(out)
    if json_out:
        emit_json(spec.to_dict())
    else:
        print_table(list(spec.to_dict().items()), columns=["field", "value"], title="machine")


@app.command()
def plan(
    dataset: Annotated[Path | None, typer.Argument(help="Dataset directory to profile the workload on.")] = None,
    machine: Annotated[Path | None, typer.Option(help="MachineSpec JSON (calibrate --out).")] = None,
    workload: Annotated[Path | None, typer.Option(help="WorkloadProfile JSON instead of profiling a dataset.")] = None,
    gpu_mem_gb: Annotated[float | None, typer.Option(help="GPU memory for the cache (overrides the machine).")] = None,
    host_mem_gb: Annotated[
        float | None, typer.Option(help="Host memory for the cache (overrides the machine).")
    ] = None,
    device: DeviceOpt = "cpu",
    fanouts: FanoutOpt = "25,10",
    batch_size: Annotated[int, typer.Option(help="Seeds per batch.")] = 1024,
    hidden: Annotated[int, typer.Option(help="Hidden width.")] = 256,
    budget: Annotated[float | None, typer.Option(help="Price limit in USD.")] = None,
    max_ssds: Annotated[int, typer.Option(help="Largest SSD count to consider.")] = 16,
    gpu_reserve_gb: Annotated[float, typer.Option(help="GPU memory kept out of the cache.")] = 8.0,
    host_reserve_gb: Annotated[float, typer.Option(help="Host memory kept out of the cache.")] = 16.0,
    json_out: JsonOpt = False,
) -> None:
    """Predict stage times, bottleneck, epoch time and TPC; recommend SSD count and caches."""
    from carina.core.errors import ConfigError
    from carina.gnn.costmodel import MachineSpec, WorkloadProfile, recommend

    spec = MachineSpec.load(machine) if machine else MachineSpec()
    overrides = {"gpu_mem_gb": gpu_mem_gb, "host_mem_gb": host_mem_gb}
    spec = MachineSpec.from_dict(spec.to_dict() | {k: v for k, v in overrides.items() if v is not None})
    if workload is not None:
        work = WorkloadProfile.load(workload)
    elif dataset is not None:
        from carina.gnn.calibrate import profile_workload
        from carina.gnn.dataset import Dataset
        from carina.gnn.runner import RunConfig
        from carina.gnn.train import TrainConfig

        cfg = RunConfig(
            train=TrainConfig(fanouts=_fanouts(fanouts), batch_size=batch_size, hidden=hidden), device=device
        )
        work = profile_workload(Dataset.open(dataset), cfg)
    else:
        raise ConfigError("give a dataset directory or --workload", key="dataset")
    best, cands = recommend(
        spec, work, budget_usd=budget, max_ssds=max_ssds, gpu_reserve_gb=gpu_reserve_gb, host_reserve_gb=host_reserve_gb
    )
    if json_out:
        emit_json({"machine": spec.to_dict(), "workload": work.to_dict(), "best": best, "candidates": cands})
        return
    rows = _plan_rows(cands)
    cols = ["SSDs", "host gather", "sample ms", "lookup ms", "disk ms", "gather ms", "transfer ms", "device gather ms"]
    cols += ["compute ms", "bottleneck", "epoch s", "seeds/s", "TPC x1e3"]
    print_table(rows, columns=cols, title=f"plan for {spec.name} (predicted)")
    typer.echo(
        f"recommended: {int(best.config['ssd_count'])} SSDs, GPU cache {int(best.config['gpu_cache_rows'])} rows, "
        f"host cache {int(best.config['host_cache_rows'])} rows, host gather on the {best.host_gather}, "
        f"reads through holes of up to {int(best.config['gap_pages'])} pages -> {best.seeds_per_s:.0f} seeds/s"
    )
    if not spec.lookup_priced:
        typer.echo("note: the machine has no cache-lookup rates (calibrated before session 13): lookup priced at 0")


def _plan_rows(cands: list[Any]) -> list[tuple[Any, ...]]:
    stages = ("sample", "lookup", "disk", "gather", "transfer", "device_gather", "compute")
    return [
        (
            int(p.config["ssd_count"]),
            p.host_gather,
            *(f"{p.stages.get(k, 0.0) * 1e3:.2f}" for k in stages),
            p.bottleneck,
            f"{p.epoch_s:.2f}",
            f"{p.seeds_per_s:.0f}",
            f"{p.tpc * 1e3:.3f}",
        )
        for p in cands
    ]


TopoOpt = Annotated[
    str,
    typer.Option(
        "--topology",
        help="A built-in name, a JSON file, an `nvidia-smi topo -m` or `lspci -tv` text file,"
        " or 'detect' (this machine).",
    ),
]


def _topology(spec: str) -> Any:
    from carina.gnn.placement import discover, topology

    if spec in topology.BUILTINS:
        return topology.builtin(spec)
    if spec == "detect":
        return _detect()
    path = Path(spec)
    if not path.is_file():
        from carina.core.errors import ConfigError

        raise ConfigError(f"not a built-in ({', '.join(topology.BUILTINS)}) nor a file", key="topology", path=spec)
    text = path.read_text()
    if text.lstrip().startswith("{"):
        return topology.from_json(text, source=str(path))
    if text.startswith(("-[", "-+-[")):
        from carina.gnn.placement.lspci import from_lspci

        return from_lspci(text, name=path.stem)
    return discover.from_nvidia_smi(text, name=path.stem)


def _detect() -> Any:
    import shutil
    import subprocess

    from carina.core.errors import BackendUnavailable
    from carina.gnn.placement import discover

    def run(*argv: str) -> str | None:
        exe = shutil.which(argv[0])
        if exe is None:
            return None
        out = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise BackendUnavailable(f"{' '.join(argv)} failed: {out.stderr.strip()[:200]}")
        return out.stdout

    smi = run("nvidia-smi", "topo", "-m")
    tree = run("lspci", "-tv", "-nn")
    if tree is not None:
        from carina.gnn.placement.lspci import from_lspci

        return from_lspci(tree, run("lspci", "-D", "-vmm", "-nn"), nvidia_smi=smi, name="detected")
    if smi is None:
        raise BackendUnavailable("neither lspci nor nvidia-smi found: describe the machine in JSON or use a built-in")
    topo = discover.from_nvidia_smi(smi, name="detected")
    discover.add_sysfs_nvme(topo)
    return topo


@app.command()
def topo(
    topology: TopoOpt = "pcie-8gpu-2socket",
    machine: Annotated[
        Path | None, typer.Option(help="MachineSpec JSON: set GPU host links and the disk to measured rates.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Print a machine topology: its nodes and link capacities (GB/s)."""
    t = _topology(topology)
    if machine is not None:
        from carina.gnn.costmodel import MachineSpec
        from carina.gnn.placement.discover import apply_measured

        spec = MachineSpec.load(machine)
        apply_measured(t, pcie_gbps=spec.pcie_gbps, disk_gbps=spec.ssd_read_gbps)
    if json_out:
        emit_json(t.to_dict())
        return
    label = " (simulated: a description, not this machine)" if t.simulated else ""
    print_table(
        [(n.name, n.kind.value, n.socket, n.capacity_gb or "") for n in t.nodes.values()],
        columns=["node", "kind", "socket", "capacity GB"],
        title=f"{t.name}{label}",
    )
    print_table([(x.src, x.dst, f"{x.gbps:.3g}") for x in t.links], columns=["from", "to", "GB/s"], title="links")


@app.command()
def place(
    topology: TopoOpt = "pcie-8gpu-2socket",
    items: Annotated[int, typer.Option(help="Feature chunks of 1 GB.")] = 256,
    alpha: Annotated[float, typer.Option(help="Power-law exponent of chunk hotness.")] = 1.2,
    batch_gb: Annotated[float, typer.Option(help="GB each GPU reads per batch.")] = 2.0,
    gpu_share: Annotated[float, typer.Option(help="Share of all chunks one GPU cache holds.")] = 0.05,
    dram_share: Annotated[float, typer.Option(help="Share of all chunks host DRAM holds.")] = 0.3,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic hotness.")] = 0,
    routes: Annotated[bool, typer.Option(help="Also print GB and utilisation on every link of carina's plan.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Place hot features and schedule transfers; compare with naive placement and routing."""
    from carina.gnn.placement.compare import compare_placements, default_capacities, route_rows, synthetic_items

    t = _topology(topology)
    it = synthetic_items(t, n_items=items, alpha=alpha, batch_gb=batch_gb, seed=seed)
    caps = default_capacities(t, it, gpu_share=gpu_share, dram_share=dram_share)
    result = compare_placements(t, it, caps)
    if json_out:
        emit_json(result)
        return
    basis = "simulated" if t.simulated else "modeled"
    rows = [
        (
            name,
            f"{r['lp_time_s'] * 1e3:.1f}",
            f"{r['simulated_lp_routes_s'] * 1e3:.1f}",
            f"{r['simulated_shortest_fair_s'] * 1e3:.1f}",
            ", ".join(f"{k} {v:.2f}" for k, v in r["bytes_by_source_kind_gb"].items()),
        )
        for name, r in result["placements"].items()
    ]
    cols = ["placement", "LP ms", "sim LP routes ms", "sim shortest-path ms", "GB per batch by source"]
    print_table(rows, columns=cols, title=f"batch transfer time on {t.name} ({basis})")
    if routes:
        links = [
            (r["link"], f"{r['gb']:.3f}", f"{r['gbps']:.3g}", f"{r['utilization']:.0%}") for r in route_rows(result)
        ]
        print_table(links, columns=["link", "GB per batch", "GB/s", "busy"], title="carina-greedy: LP load per link")
