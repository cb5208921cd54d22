"""Turn a load-test result into one ``carina.core.bench`` record (figures with ceilings and peers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from carina.core.bench import Figure, make_record, write_record
from carina.core.progress import to_jsonable

__all__ = ["figures_from", "write_bench_record"]

_PEERS = {
    "inline": "carina-inline (1 process)",
    "forward": "carina-forward (no compression)",
    "nbdkit": "nbdkit-file",
    "process": "carina-process (worker processes)",
    "thread": "carina-thread (codec threads)",
    "thread-loop": "carina-thread-loop (codec threads + the event loop)",
    "process-loop": "carina-process-loop (worker processes + the event loop)",
}


def _peer(system: str) -> str:
    """The peer label of ``system``; ``-fe<N>`` systems name their front ends (``process-fe2``)."""
    base, sep, fe = system.rpartition("-fe")
    if sep and fe.isdigit() and base in _PEERS:
        return f"carina-{base} x{fe} front ends"
    return _PEERS.get(system, system)


def _label(block: int) -> str:
    return f"{block >> 10}k" if block % 1024 == 0 else str(block)


def figures_from(result: dict[str, Any], *, main: str = "process") -> list[Figure]:
    """Figures of the ``main`` system per block size, the other systems as peers."""
    out: list[Figure] = []
    blocks = sorted({r["block"] for r in result["rows"]})
    for block in blocks:
        rows = {r["system"]: r for r in result["rows"] if r["block"] == block}
        if main not in rows:
            continue
        ceil = result["ceilings"][str(block)]
        lab = _label(block)
        src = "codec's raw single-core {} MB/s on the same data set, in-process"
        specs = [
            ("randread_mb_s", "MB/s", True, ceil["decompress_mb_s"], src.format("decompress")),
            ("randwrite_mb_s", "MB/s", True, ceil["compress_mb_s"], src.format("compress")),
            ("fill_mb_s", "MB/s", True, ceil["compress_mb_s"], src.format("compress")),
            ("randread_p99_ms", "ms", False, None, ""),
            ("randwrite_p99_ms", "ms", False, None, ""),
        ]
        for key, unit, better, ceiling, source in specs:
            peers = {_peer(s): float(r[key]) for s, r in rows.items() if s != main}
            out.append(
                Figure(name=f"{key}_{lab}", value=float(rows[main][key]), unit=unit, higher_is_better=better,
                       ceiling=ceiling, ceiling_source=source, peers=peers)
            )  # fmt: skip
        out += _over_inline(rows, lab)
        if "ratio" in rows[main]:
            out.append(
                Figure(name=f"compression_ratio_{lab}", value=float(rows[main]["ratio"]), unit="x",
                       ceiling=ceil["ratio"], ceiling_source="same codec over the same blocks, in-process")
            )  # fmt: skip
    return out


def _over_inline(rows: dict[str, dict[str, Any]], lab: str) -> list[Figure]:
    """Every pool's MB/s over ``inline``'s (issue 12's baseline), per load: ``<system>_vs_inline_<load>_<block>``."""
    if "inline" not in rows:
        return []
    out = []
    for system, row in rows.items():
        if system in ("inline", "forward", "nbdkit"):
            continue
        for load in ("randread", "randwrite", "fill"):
            base = float(rows["inline"][f"{load}_mb_s"])
            if base > 0:
                out.append(Figure(name=f"{system}_vs_inline_{load}_{lab}", value=float(row[f"{load}_mb_s"]) / base,
                                  unit="x", peers={}))  # fmt: skip
    return out


def _without_checkout_paths(value: Any, root: str) -> Any:
    """Replace the checkout's absolute path in every string (records must not name this machine's paths)."""
    if isinstance(value, dict):
        return {k: _without_checkout_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_checkout_paths(v, root) for v in value]
    return value.replace(root, "<repo>") if isinstance(value, str) else value


def write_bench_record(
    config: Any,
    result: dict[str, Any],
    *,
    command: list[str] | None = None,
    name: str = "",
    main: str = "process",
    notes: str = "",
) -> Path:
    """Write the record ``infra_storage_tier[_<codec>]`` (or ``name``) under ``benchmarks/results/<machine>/``.

    LZ4 (the default codec) writes ``infra_storage_tier``; other codecs add their name. ``main`` is the
    system the figures are about; the others are its peers.
    """
    notes = (
        "Codec {codec}. Loopback on one machine: fio (ioengine=nbd, QD {qd}) and the servers share its cores; "
        "all systems run side by side and fio runs are interleaved across them, median of the runs. "
        "Systems: process = "
        "carina tier with the worker-pool engine ({w} workers); thread = the same with {w} codec threads; "
        "thread-loop = {w1} codec threads and the event loop running what no idle thread takes; "
        "process-loop = {w1} worker processes and the event loop running what no idle worker takes; "
        "inline = same tier, header and payload in one "
        "process; forward = carina tier with codec raw; nbdkit-file = plain uncompressed NBD server. Data set: ext4 "
        "image with Python sources and shared libraries; fio writes carry 50%-compressible buffers. "
        "-fe<N>: the system as N front-end processes (--frontends N, connections balanced). "
        "fio: {clients} connection(s) sharing queue depth {qd}; client_cores is fio's own CPU. Load average "
        "during the run: {l0} -> {l1} (other jobs shared the machine). {extra}"
    ).format(
        codec=config.codec.value,
        qd=config.iodepth, w=config.workers, w1=max(config.workers - 1, 1), clients=config.clients, extra=notes,
        l0=[round(x, 1) for x in result["loadavg_start"]], l1=[round(x, 1) for x in result["loadavg_end"]],
    )  # fmt: skip
    from carina.core.doctor import collect

    root = str(Path(__file__).resolve().parents[4])
    environment = _without_checkout_paths(to_jsonable(collect(paths=())), root)
    record = make_record(
        environment=environment,
        name=name or "infra_storage_tier" + ("" if config.codec.value == "lz4" else f"_{config.codec.value}"),
        figures=figures_from(result, main=main),
        config=config,
        command=command,
        metrics={"rows": result["rows"], "codec_single_core": result["ceilings"]},
        notes=notes,
    )
    return write_record(record)
