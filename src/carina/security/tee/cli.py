"""``carina tee``: detect TEEs, measure (natively or emulated) and compare records."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Confidential-computing overhead: detect, measure, emulate.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@app.command()
def detect(json_out: JsonOpt = False) -> None:
    """CPU TEE, GPU CC mode and attestation availability of this machine (never faked)."""
    from carina.core.progress import emit_json, print_table
    from carina.security.tee.detect import detect as run

    report = run()
    if json_out:
        emit_json(report.to_dict())
        return
    rows = [
        {"item": "CPU TEE", "value": report.cpu_tee.value, "detail": "; ".join(report.cpu_evidence)},
        {
            "item": "GPU CC mode",
            "value": report.gpu_cc.value,
            "detail": f"via {report.gpu_source} {report.gpu_details or ''}",
        },
    ]
    rows += [
        {"item": f"attestation ({k})", "value": v["status"], "detail": v["reason"]}
        for k, v in report.attestation.items()
    ]
    print_table(rows, columns=["item", "value", "detail"], title="TEE detection")


@app.command()
def bench(
    mode: Annotated[str, typer.Option(help="native or emulated (CC data path emulated).")] = "native",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    models: Annotated[str, typer.Option(help="Comma-separated workload models.")] = "bert-tiny,llama-tiny",
    batches: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,4",
    seq: Annotated[str, typer.Option(help="Comma-separated sequence/prompt lengths.")] = "32",
    new_tokens: Annotated[int, typer.Option(help="Generated tokens per decoder request.")] = 8,
    sizes: Annotated[
        str, typer.Option(help="Comma-separated transfer sizes in bytes.")
    ] = "4096,65536,1048576,16777216",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    threads: Annotated[int, typer.Option(help="torch CPU threads (0: leave as is).")] = 0,
    repeat: Annotated[int, typer.Option(help="Runs per figure (median and CV reported).")] = 5,
    out: Annotated[
        Path | None, typer.Option(help="Directory for the record (default: benchmarks/results/<machine>).")
    ] = None,
    name: Annotated[str, typer.Option(help="Record name (default: security_tee_<mode>_<device>).")] = "",
    json_out: JsonOpt = False,
) -> None:
    """Run detection, micro-benchmarks and workloads; write one JSON record."""
    import sys

    from carina.core.bench import write_record
    from carina.core.progress import emit_json, print_table
    from carina.security.tee.micro import MicroConfig, pick_device
    from carina.security.tee.report import bench_record
    from carina.security.tee.workloads import WorkloadConfig

    if threads:
        import torch

        torch.set_num_threads(threads)
    dev = pick_device(device)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    micro = MicroConfig(device=dev, mode=mode, sizes=ints(sizes), repeat=repeat, small=20 * repeat)
    work = WorkloadConfig(
        device=dev, mode=mode, models=models.split(","), batches=ints(batches), seq_lens=ints(seq),
        new_tokens=new_tokens, dtype=dtype, repeat=repeat,
    )  # fmt: skip
    record = bench_record(
        micro,
        work,
        name=name or f"security_tee_{mode}_{dev.split(':')[0]}",
        command=" ".join(["carina", "tee", *sys.argv[1:]]),
    )
    path = write_record(record, directory=out)
    if json_out:
        emit_json({"record": str(path), **record["metrics"]})
        return
    rows = [
        {k: r[k] for k in ("model", "batch", "seq", "pipelined", "basis")} | {"tokens/s": f"{r['tokens_per_s']:.4g}"}
        for r in record["metrics"]["workloads"]
    ]
    print_table(rows, columns=["model", "batch", "seq", "pipelined", "basis", "tokens/s"], title=f"written {path}")


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="Baseline record (e.g. native).", exists=True)],
    b: Annotated[Path, typer.Argument(help="Other record (e.g. CC or emulated).", exists=True)],
    png: Annotated[Path | None, typer.Option(help="Write the overhead plot here.")] = None,
    html: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Overhead of B relative to A: transfers and workloads, as a table, PNG and HTML."""
    from carina.core.progress import emit_json, print_table
    from carina.security.tee.report import compare as run
    from carina.security.tee.report import load_record, render_compare_html, render_compare_png

    result = run(load_record(a), load_record(b))
    if png:
        render_compare_png(result, png)
    if html:
        html.write_text(render_compare_html(result))
    if json_out:
        emit_json(result)
        return
    rows = [
        {
            "model": r["model"],
            "batch": r["batch"],
            "seq": r["seq"],
            "pipelined": r["pipelined"],
            "latency +%": f"{100 * r['latency_overhead']:.1f}",
            "basis": r["basis"],
        }
        for r in result["workloads"]
    ]
    print_table(
        rows, columns=["model", "batch", "seq", "pipelined", "latency +%", "basis"], title=f"{b.name} vs {a.name}"
    )
