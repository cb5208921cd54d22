"""``carina storage``: serve the middle tier, benchmark it, show its stats."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from carina.core.errors import CarinaError
from carina.core.progress import console, emit_json, print_table

app = typer.Typer(help="Storage middle tier with offloaded compression (NBD front end).", no_args_is_help=True)

_SizeOpt = Annotated[str, typer.Option("--size", help="Export size (64M, 1G, ...); fixed at creation.")]


def _choice(kind: Any, value: str, option: str) -> Any:
    """``kind(value)``, or a ConfigError naming the option and its choices."""
    from carina.core.errors import ConfigError

    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise ConfigError(f"--{option.replace('_', '-')} must be one of {choices}, not {value!r}", key=option) from None


def _tier_config(**kw: Any) -> Any:
    from carina.infra.storage.config import (
        CodecName,
        EngineConfig,
        EngineKind,
        LoopKind,
        Overflow,
        ServerConfig,
        StoreConfig,
        TierConfig,
        parse_size,
    )
    from carina.infra.storage.cudawait import CudaWait

    return TierConfig(
        store=StoreConfig(
            path=kw["store"], size=parse_size(kw["size"]), block_size=parse_size(kw["block_size"]),
            codec=_choice(CodecName, kw["codec"], "codec"),
        ),
        engine=EngineConfig(
            kind=_choice(EngineKind, kw["engine"], "engine"), workers=kw["workers"], device=kw["device"],
            inflight=kw["inflight"], overflow=_choice(Overflow, kw["overflow"], "overflow"),
            loop_below=parse_size(kw["loop_below"]), cuda_wait=_choice(CudaWait, kw["cuda_wait"], "cuda_wait"),
        ),
        server=ServerConfig(
            host=kw["host"], port=kw["port"], export=kw["export"], slots=kw["slots"],
            loop=_choice(LoopKind, kw["loop"], "loop"), stats_interval=kw["stats_interval"],
        ),
    )  # fmt: skip


@app.command()
def serve(
    store: Annotated[Path, typer.Option(help="Store directory (created if absent).")] = Path("carina-store"),
    size: _SizeOpt = "1G",
    block_size: Annotated[str, typer.Option(help="Compression block size.")] = "64K",
    codec: Annotated[str, typer.Option(help="raw, zlib, deflate, lz4, zstd or zvc.")] = "lz4",
    engine: Annotated[str, typer.Option(help="Payload engine: inline, thread, process, torch or nvcomp.")] = "process",
    workers: Annotated[int, typer.Option(help="Threads, worker processes or launch threads (torch).")] = 2,
    device: Annotated[str, typer.Option(help="Torch engine device (auto, cpu, cuda).")] = "auto",
    inflight: Annotated[
        int | None, typer.Option(help="Most engine batches in flight (default: the engine's; 0: no limit).")
    ] = None,
    overflow: Annotated[
        str, typer.Option(help="CPU pools, all workers busy: queue, or loop (the event loop runs the job).")
    ] = "queue",
    loop_below: Annotated[
        str, typer.Option(help="CPU pools: decompress blocks smaller than this in the event loop (0: never).")
    ] = "16K",
    cuda_wait: Annotated[
        str, typer.Option(help="torch/nvcomp on CUDA: launch threads wait by spin (CUDA's default) or block.")
    ] = "spin",
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 picks one).")] = 10809,
    export: Annotated[str, typer.Option(help="Export name.")] = "carina",
    slots: Annotated[int, typer.Option(help="Payload slots (requests in flight).")] = 32,
    loop: Annotated[str, typer.Option(help="Event loop: auto, asyncio or uvloop.")] = "auto",
    stats_interval: Annotated[float, typer.Option(help="Seconds between live stats.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a live line.")] = False,
    frontends: Annotated[int, typer.Option(help="Front-end processes sharing one store and one listening socket.")] = 1,
) -> None:
    """Serve the store over NBD until interrupted (Ctrl-C or SIGTERM), with live stats."""
    from carina.infra.storage.service import run

    try:
        cfg = _tier_config(**locals())
    except CarinaError as exc:
        raise typer.BadParameter(str(exc)) from exc
    out = console(stderr=True)

    def live(snap: dict[str, Any]) -> None:
        if as_json:
            _line({"event": "stats", **snap})
        else:
            out.print(_live_line(snap))

    if frontends > 1:
        _serve_many(cfg, frontends, as_json=as_json, on_stats=live)
        return

    def ready(server: Any) -> None:
        url = f"nbd://{cfg.server.host}:{server.ports[0]}/{cfg.server.export}"
        if as_json:
            _line({"event": "ready", "url": url, "port": server.ports[0], "engine": server.tier.engine.name})
        else:
            out.print(f"serving {url} (engine {server.tier.engine.name}, codec {cfg.store.codec.value})")
            sys.stdout.write(f"READY {url}\n")
            sys.stdout.flush()

    try:
        final = run(cfg, ready=ready, on_stats=live)
    except CarinaError as exc:
        out.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    if as_json:
        _line({"event": "stopped", **final})


def _serve_many(cfg: Any, frontends: int, *, as_json: bool, on_stats: Any) -> None:
    """``serve --frontends N``: N front-end processes over one shared store, their live stats merged."""
    from carina.infra.storage.frontends import run_frontends

    out = console(stderr=True)

    def ready(info: dict[str, Any]) -> None:
        url = f"nbd://{cfg.server.host}:{info['port']}/{cfg.server.export}"
        if as_json:
            _line({"event": "ready", "url": url, "port": info["port"], "engine": cfg.engine.kind.value,
                   "frontends": frontends, "pids": info["pids"]})  # fmt: skip
        else:
            out.print(f"serving {url} from {frontends} front-end processes {info['pids']}")
            sys.stdout.write(f"READY {url}\n")
            sys.stdout.flush()

    try:
        final = run_frontends(cfg, processes=frontends, ready=ready, on_stats=on_stats)
    except CarinaError as exc:
        out.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    if as_json:
        _line({"event": "stopped", **final})


def _line(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _live_line(s: dict[str, Any]) -> str:
    return (
        f"{s['iops']:9.0f} IOPS  read {s['read_mb_s']:8.1f} MB/s  write {s['write_mb_s']:8.1f} MB/s  "
        f"p50 {s['p50_ms']:6.2f} ms  p99 {s['p99_ms']:6.2f} ms  ratio {s.get('ratio', 0):.2f}  conns {s['connections']}"
    )


@app.command()
def stats(
    store: Annotated[Path, typer.Option(help="Store directory.")] = Path("carina-store"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a store's space accounting and the last live stats of the server using it."""
    from carina.infra.storage.store import read_store_summary

    try:
        summary: dict[str, Any] = dict(read_store_summary(store))
    except CarinaError as exc:
        console(stderr=True).print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    live_path = store / "stats.json"
    if live_path.exists():
        summary["live"] = json.loads(live_path.read_text())
    if as_json:
        emit_json(summary)
        return
    rows = [(k, v) for k, v in summary.items() if k != "live"]
    live = summary.get("live", {})
    rows += [(f"live.{k}", v) for k, v in live.items() if not isinstance(v, dict | list)]
    if isinstance(live.get("frontends"), list):  # written by serve --frontends N: the merged stats of N processes
        rows.append(("live.frontends", len(live["frontends"])))
    print_table(rows, columns=["field", "value"], title=f"store {store}")


@app.command()
def bench(
    size: _SizeOpt = "64M",
    seconds: Annotated[float, typer.Option(help="Seconds per fio run.")] = 3.0,
    block_sizes: Annotated[str, typer.Option(help="Comma-separated request/block sizes.")] = "4K,64K",
    runs: Annotated[int, typer.Option(help="Repetitions per case (median reported).")] = 1,
    record: Annotated[bool, typer.Option(help="Write a benchmark record.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Measure the tier (process pool, inline) against nbdkit's plain file export with fio."""
    from carina.infra.storage.config import parse_size
    from carina.infra.storage.loadtest import BenchConfig, run_bench

    cfg = BenchConfig(
        image_bytes=parse_size(size),
        seconds=seconds,
        block_sizes=[parse_size(b) for b in block_sizes.split(",")],
        runs=runs,
    )
    try:
        result = run_bench(cfg, record=record)
    except CarinaError as exc:
        console(stderr=True).print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    if as_json:
        emit_json(result)
        return
    print_table(result["rows"], columns=list(result["rows"][0]) if result["rows"] else [], title="storage tier")
