"""``carina cluster``: check a node, serve its health to Prometheus, model throughput at scale."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from carina.infra.cluster.rendezvous import Rendezvous
    from carina.infra.cluster.runner import RunConfig

app = typer.Typer(help="GPU node validation, collectives and a scaling model (Vela).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _run_config(
    checks: list[str] | None, quick: bool, device: str, timeout: float, paths: list[Path] | None
) -> RunConfig:
    from carina.infra.cluster.runner import RunConfig

    return RunConfig(
        checks=list(checks or []),
        quick=quick,
        device=device,
        timeout_s=timeout,
        paths=[str(p) for p in (paths or [Path(".")])],
    )


@app.command("list")
def list_checks(json_out: JsonOpt = False) -> None:
    """List every check with what it needs and why its threshold is what it is."""
    from carina.core.progress import emit_json, print_table
    from carina.infra.cluster.checks import CHECKS

    rows = []
    for name in CHECKS.names():
        cls = CHECKS.load(name)
        rows.append({"check": name, "needs": ", ".join(cls.needs) or "-", "rationale": cls.rationale})
    if json_out:
        emit_json(rows)
    else:
        print_table(rows, columns=["check", "needs", "rationale"], title="carina cluster checks")


@app.command()
def check(
    checks: Annotated[list[str] | None, typer.Option("--check", "-c", help="Run only these (repeatable).")] = None,
    quick: Annotated[bool, typer.Option(help="Small sizes (smoke runs, CI).")] = False,
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    timeout: Annotated[float, typer.Option(help="Seconds per check.")] = 120.0,
    path: Annotated[list[Path] | None, typer.Option(help="Disk paths for disk_bw (repeatable).")] = None,
    nodes: Annotated[
        str | None, typer.Option(help="Several nodes: 'env://' (torchrun) or a hostfile; runs link tests.")
    ] = None,
    rank: Annotated[int | None, typer.Option(help="This node's rank in the hostfile (default: by host name).")] = None,
    nbytes: Annotated[int, typer.Option(help="Bytes per message of the link tests.")] = 1 << 24,
    json_out: JsonOpt = False,
) -> None:
    """Run node checks (exit 1 on EVICT), or with --nodes the pairwise/ring link tests (exit 1 if one is slow)."""
    if nodes is not None:
        from carina.infra.cluster.rendezvous import from_hostfile

        raise typer.Exit(1 if _links(from_hostfile(nodes, rank=rank), nbytes, json_out) else 0)
    from carina.core.progress import emit_json, print_table, progress
    from carina.infra.cluster.checks import CHECKS
    from carina.infra.cluster.runner import NodeLabel, run_checks

    config = _run_config(checks, quick, device, timeout, path)
    total = len(config.checks) or len(CHECKS.names())
    with progress(transient=True) as bar:
        task = bar.add_task("checking", total=total)
        report = run_checks(config, on_result=lambda _: bar.advance(task))
    if json_out:
        emit_json(report)
    else:
        rows = [
            {"check": r.name, "status": r.status.value, "seconds": f"{r.seconds:.1f}", "details": r.message}
            for r in report.results
        ]
        print_table(
            rows, columns=["check", "status", "seconds", "details"], title=f"{report.node}: {report.label.value}"
        )
    raise typer.Exit(1 if report.label is NodeLabel.EVICT else 0)


@app.command()
def serve(
    port: Annotated[int, typer.Option(help="HTTP port of /metrics.")] = 9400,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "0.0.0.0",
    interval: Annotated[float, typer.Option(help="Seconds between check runs.")] = 300.0,
    quick: Annotated[bool, typer.Option(help="Small sizes.")] = False,
    checks: Annotated[list[str] | None, typer.Option("--check", "-c", help="Run only these.")] = None,
) -> None:
    """Serve node health as Prometheus metrics (label PASS / WARN / EVICT)."""
    import time

    from carina.infra.cluster.exporter import Exporter
    from carina.infra.cluster.runner import run_checks

    config = _run_config(checks, quick, "auto", 120.0, None)
    exporter = Exporter(lambda: run_checks(config), interval_s=interval)
    bound = exporter.serve(host, port)
    typer.echo(f"serving http://{host}:{bound}/metrics (node {exporter.report.label.value})")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        exporter.close()


@app.command()
def model(
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 62,
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = 8192,
    seq_len: Annotated[int, typer.Option(help="Sequence length.")] = 2048,
    batch: Annotated[int, typer.Option(help="Global batch in sequences.")] = 1536,
    gpus: Annotated[int, typer.Option(help="Total GPUs.")] = 1536,
    peak_tflops: Annotated[float, typer.Option(help="bf16 peak per GPU.")] = 312.0,
    efficiency: Annotated[float, typer.Option(help="Sustained fraction of peak.")] = 0.5,
    inter_gbit: Annotated[float, typer.Option(help="Per-GPU inter-node Gbit/s.")] = 25.0,
    intra_gbps: Annotated[float, typer.Option(help="Per-GPU intra-node GB/s.")] = 300.0,
    memory_gib: Annotated[float, typer.Option(help="GPU memory.")] = 80.0,
    dp_overlap: Annotated[float, typer.Option(help="Hidden fraction of the DP all-reduce.")] = 0.0,
    top: Annotated[int, typer.Option(help="How many layouts to show.")] = 5,
    json_out: JsonOpt = False,
) -> None:
    """Search parallel layouts and report expected TFLOP/s per GPU, MFU and % of ideal (defaults: Vela's 50B)."""
    from carina.core.progress import emit_json, print_table
    from carina.infra.cluster.model import Cluster, ModelShape, search

    shape = ModelShape(layers=layers, hidden=hidden, seq_len=seq_len, global_batch=batch)
    cluster = Cluster(
        gpus=gpus,
        peak_tflops=peak_tflops,
        efficiency=efficiency,
        inter_gbit=inter_gbit,
        intra_gbps=intra_gbps,
        memory_gib=memory_gib,
        dp_overlap=dp_overlap,
    )
    best = search(shape, cluster, top=top)
    if json_out:
        emit_json({"shape": shape.to_dict(), "cluster": cluster.to_dict(), "predictions": best})
        return
    rows = [
        {
            "t·p·d×mb": f"{p.layout.tensor}·{p.layout.pipeline}·{p.layout.data}×{p.layout.micro_batch}",
            "TFLOP/s/GPU": f"{p.tflops_per_gpu:.1f}",
            "MFU": f"{p.mfu:.1%}",
            "% of ideal": f"{p.fraction_of_ideal:.1%}",
            "step s": f"{p.step_s:.2f}",
            "GiB/GPU": f"{p.memory_gib:.1f}",
        }
        for p in best
    ]
    print_table(
        rows,
        columns=list(rows[0]),
        title=f"{shape.parameters() / 1e9:.1f}B parameters on {gpus} GPUs at {inter_gbit:g} Gbit/s",
    )


def _links(rdv: Rendezvous, nbytes: int, json_out: bool) -> bool:
    """Run the pairwise and ring tests in the group; print on rank 0; True when a slow node was named."""
    from datetime import timedelta

    import torch.distributed as dist

    from carina.core.progress import emit_json, print_table
    from carina.infra.cluster.multinode import find_slow, pairwise_bandwidth, ring_bandwidth

    dist.init_process_group(
        "gloo",
        init_method=rdv.init_method,
        timeout=timedelta(seconds=300),
        rank=-1 if rdv.rank is None else rdv.rank,  # -1 / -1: from the environment (env://)
        world_size=-1 if rdv.world is None else rdv.world,
    )
    try:
        pairs, ring = pairwise_bandwidth(nbytes), ring_bandwidth(nbytes)
    finally:
        dist.destroy_process_group()
    if not pairs:  # not rank 0
        return False
    verdict = find_slow(pairs)
    if json_out:
        emit_json({"pairwise_gbps": pairs, "ring_gbps": ring, "slow": verdict})
    else:
        rows = [
            {"link": k, "GB/s": f"{v:.2f}", "slow": "yes" if k in verdict["links"] else ""} for k, v in pairs.items()
        ]
        print_table(rows, columns=["link", "GB/s", "slow"], title="pairwise bandwidth")
        if verdict["nodes"]:
            typer.echo(f"slow node(s): {', '.join(verdict['nodes'])}")
    return bool(verdict["nodes"] or verdict["links"])
