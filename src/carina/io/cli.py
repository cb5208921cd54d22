"""``carina io``: probe the storage stack, read and write files, benchmark the engine."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Asynchronous batched storage engine: probe, read, write, bench.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="auto, uring, posix or null.")]
DirectOpt = Annotated[str, typer.Option("--direct", help="O_DIRECT policy: auto, on or off.")]
QdOpt = Annotated[int, typer.Option("--queue-depth", help="Most operations in flight.")]


def parse_size(text: str) -> int:
    """``4K``, ``1MiB``, ``512`` -> bytes; a bad size is a usage error."""
    from carina.core.errors import ConfigError
    from carina.io.workload import parse_size as parse

    try:
        return parse(text)
    except ConfigError as exc:
        raise typer.BadParameter(exc.message) from exc


def _sizes(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def _engine(backend: str, direct: str, queue_depth: int) -> Any:
    from carina.core.errors import CarinaError
    from carina.io import IOConfig, IOEngine

    try:
        return IOEngine(IOConfig(backend=backend, direct=direct, queue_depth=queue_depth))  # type: ignore[arg-type]
    except CarinaError as exc:
        raise typer.BadParameter(str(exc)) from exc


def probe_report(path: Path) -> dict[str, Any]:
    """What ``carina io probe`` shows: backend choice with reasons, the batched-gather path, io_uring, O_DIRECT."""
    from carina.core.probes import probe_io_uring, probe_path
    from carina.io._rows import gather_path_report
    from carina.io.backends import AUTO_ORDER, choose_backend

    selection = choose_backend("auto")
    uring_ok, uring_why = probe_io_uring()
    where = probe_path(path)
    return {
        "backend": selection.backend.name,
        "skipped": selection.skipped,
        "order": list(AUTO_ORDER),
        "named_only": {"kvikio": _kvikio_reasons() or ["available"]},
        "io_uring": {"works": uring_ok, "reason": uring_why},
        "gather_path": gather_path_report(),
        "path": {
            "path": str(path),
            "filesystem": where.filesystem,
            "o_direct": where.o_direct,
            "o_direct_reason": where.o_direct_reason,
        },
    }


def _kvikio_reasons() -> list[str]:
    from carina.io.backends.kvikio import KvikioBackend

    return KvikioBackend.probe_reasons()


@app.command()
def probe(
    path: Annotated[Path, typer.Argument(help="Directory or file to check.")] = Path("."), json_out: JsonOpt = False
) -> None:
    """Which backend ``auto`` picks here and why the others were skipped; O_DIRECT and io_uring."""
    report = probe_report(path)
    if json_out:
        from carina.core.progress import emit_json

        emit_json(report)
        return
    from carina.core.progress import print_table

    rows = [("backend (auto)", report["backend"])]
    rows += [(f"skipped {name}", "; ".join(why)) for name, why in report["skipped"].items()]
    rows += [(f"{name} (only when named)", "; ".join(why)) for name, why in report["named_only"].items()]
    gathers = report["gather_path"]
    rows += [
        (f"batched gathers (auto, {gathers['device']})", f"{gathers['path']}: {gathers['why']}"),
        ("io_uring", report["io_uring"]["reason"]),
        ("O_DIRECT at " + report["path"]["path"], report["path"]["o_direct_reason"]),
        ("file system", report["path"]["filesystem"]),
    ]
    print_table(rows, columns=["what", "finding"], title="carina io probe")


@app.command()
def info(
    path: Annotated[Path, typer.Argument(help="Directory or file to check.")] = Path("."), json_out: JsonOpt = False
) -> None:
    """Same as ``probe``."""
    probe(path, json_out)


@app.command()
def write(
    path: Annotated[Path, typer.Argument(help="File to create (overwritten).")],
    size: Annotated[str, typer.Option("--size", help="Bytes to write, e.g. 64M.")] = "64M",
    seed: Annotated[int, typer.Option("--seed", help="Pattern seed (read --verify-seed checks it).")] = 0,
    backend: BackendOpt = "auto",
    direct: DirectOpt = "auto",
    queue_depth: QdOpt = 64,
    json_out: JsonOpt = False,
) -> None:
    """Fill a file with carina's verifiable pattern (fsynced)."""
    from carina.io.workload import fill_file

    nbytes = parse_size(size)
    if nbytes % 8:
        raise typer.BadParameter("size must be a multiple of 8 bytes")
    with _engine(backend, direct, queue_depth) as eng:
        h = eng.open(path, "w")
        t0 = time.perf_counter()
        fill_file(eng, h, nbytes, seed=seed)
        seconds = time.perf_counter() - t0
        out = {
            "path": str(path),
            "bytes": nbytes,
            "seconds": seconds,
            "bytes_per_s": nbytes / seconds,
            "backend": eng.backend.name,
            "direct": h.direct,
        }
    _show(out, json_out, "carina io write")


@app.command()
def read(
    path: Annotated[Path, typer.Argument(help="File to read.")],
    offset: Annotated[str, typer.Option("--offset", help="First byte, e.g. 4K.")] = "0",
    length: Annotated[str, typer.Option("--length", help="Bytes to read (default: to the end).")] = "",
    verify_seed: Annotated[int | None, typer.Option("--verify-seed", help="Check against the pattern.")] = None,
    backend: BackendOpt = "auto",
    direct: DirectOpt = "auto",
    queue_depth: QdOpt = 64,
    json_out: JsonOpt = False,
) -> None:
    """Read a byte range; print its SHA-256 and rate (and check carina's pattern)."""
    from carina.io import aligned_buffer
    from carina.io.workload import expected

    start = parse_size(offset)
    with _engine(backend, direct, queue_depth) as eng:
        h = eng.open(path, "r")
        nbytes = parse_size(length) if length else max(0, h.size - start)
        buf = aligned_buffer(nbytes)
        t0 = time.perf_counter()
        chunk = 4 << 20
        futs = [eng.read(h, start + o, buf[o : o + chunk]) for o in range(0, nbytes, chunk)]
        for fut in futs:
            fut.result()
        seconds = time.perf_counter() - t0
        out: dict[str, Any] = {
            "path": str(path),
            "offset": start,
            "bytes": nbytes,
            "seconds": seconds,
            "bytes_per_s": nbytes / seconds if seconds else 0.0,
            "sha256": hashlib.sha256(buf.data).hexdigest(),
            "backend": eng.backend.name,
        }
    if verify_seed is not None:
        out["pattern_ok"] = bool((buf == expected(start, nbytes, verify_seed)).all())
    _show(out, json_out, "carina io read")
    if out.get("pattern_ok") is False:
        raise typer.Exit(1)


@app.command()
def bench(
    path: Annotated[Path, typer.Argument(help="Scratch file to create and test (overwritten).")],
    size: Annotated[str, typer.Option("--size", help="Test file size.")] = "256M",
    blocks: Annotated[str, typer.Option("--blocks", help="Block sizes, comma separated.")] = "4K,1M",
    depths: Annotated[str, typer.Option("--depths", help="Queue depths, comma separated.")] = "1,32,128",
    kinds: Annotated[str, typer.Option("--kinds", help="read, write or both.")] = "read,write",
    access: Annotated[str, typer.Option("--access", help="seq, rand or both.")] = "seq,rand",
    seconds: Annotated[float, typer.Option("--seconds", help="Seconds per case.")] = 2.0,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check every byte read.")] = True,
    backend: BackendOpt = "auto",
    direct: DirectOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Sequential/random reads and writes over block sizes and queue depths, every byte read checked."""
    from carina.core.progress import progress
    from carina.io.workload import Access, fill_file, run_case

    cases = [
        (k, Access(a), b, q)
        for k in kinds.split(",")
        for a in access.split(",")
        for b in _sizes(blocks)
        for q in (int(d) for d in depths.split(","))
    ]
    nbytes = parse_size(size)
    rows = []
    with _engine(backend, direct, max(int(d) for d in depths.split(","))) as eng:
        h = eng.open(path, "w")
        fill_file(eng, h, nbytes)
        with progress(transient=True) as bar:
            task = bar.add_task("io bench", total=len(cases))
            for kind, acc, block, qd in cases:
                result = run_case(
                    eng, h, kind=kind, access=acc, block=block, queue_depth=qd, seconds=seconds, verify=verify
                )
                rows.append({**result.to_dict(), "backend": eng.backend.name, "direct": h.direct})
                bar.advance(task)
    path.unlink(missing_ok=True)
    if json_out:
        from carina.core.progress import emit_json

        emit_json(rows)
        return
    from carina.core.progress import print_table

    table = [
        {
            "case": f"{r['kind']} {r['access']} {r['block']} B qd{r['queue_depth']}",
            "MB/s": f"{r['bytes_per_s'] / 1e6:.0f}",
            "IOPS": f"{r['iops']:.0f}",
            "verified": r["verified_bytes"],
        }
        for r in rows
    ]
    print_table(table, columns=["case", "MB/s", "IOPS", "verified"], title=f"carina io bench ({rows[0]['backend']})")


def _show(out: dict[str, Any], json_out: bool, title: str) -> None:
    from carina.core.progress import emit_json, print_table

    if json_out:
        emit_json(out)
    else:
        print_table([(k, v) for k, v in out.items()], columns=["field", "value"], title=title)
