"""Micro-benchmarks of the host-device path, natively or through the emulated CC link.

Rows: H2D/D2H bandwidth by size (pageable and pinned memory natively; the bounce-buffer
path when emulated), small-copy latency, many-small-copies rate, kernel-launch latency,
allocation cost, concurrent-stream copy scaling (CUDA only) and the CPU's AES-GCM
throughput by chunk size. Each row gives the median of ``repeat`` runs and their
coefficient of variation, and its basis: ``measured`` or ``emulated``. The same code runs
on ``cpu`` (host-to-host copies) and ``cuda``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from carina.core.config import Config, require
from carina.security.tee.bounce import aes_gcm_throughput
from carina.security.tee.emulate import CCLinkConfig, EmulatedCCLink, device_copy

__all__ = ["MicroConfig", "pick_device", "run_micro"]


def pick_device(device: str) -> str:
    """``auto`` becomes ``cuda`` when a GPU is visible, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(kw_only=True)
class MicroConfig(Config):
    """What the micro suite measures.

    Attributes:
        device: ``auto``, ``cpu`` or ``cuda[:i]``.
        mode: ``native`` or ``emulated`` (transfers through :class:`EmulatedCCLink`).
        sizes: Transfer sizes in bytes.
        repeat: Runs per figure (median and CV reported).
        small: Copies/launches/allocations per latency figure.
        streams: Stream counts for the concurrency figure (CUDA only).
        aes_chunks: Chunk sizes for the AES-GCM throughput figure.
        link: Parameters of the emulated link.
    """

    device: str = "auto"
    mode: str = "native"
    sizes: list[int] = field(default_factory=lambda: [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20])
    repeat: int = 5
    small: int = 200
    streams: list[int] = field(default_factory=lambda: [1, 2, 4])
    aes_chunks: list[int] = field(default_factory=lambda: [4 << 10, 64 << 10, 1 << 20, 4 << 20])
    link: CCLinkConfig = field(default_factory=CCLinkConfig)

    def validate(self) -> None:
        """Check the fields."""
        require(self.mode in ("native", "emulated"), "must be native or emulated", key="mode")
        require(all(s > 0 for s in self.sizes), "sizes must be positive", key="sizes")
        require(self.repeat > 0 and self.small > 0, "must be positive", key="repeat")
        require(max(self.sizes) <= self.link.capacity, "largest size must fit link.capacity", key="sizes")


def _median_cv(times: list[float]) -> tuple[float, float]:
    med = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 and statistics.mean(times) > 0 else 0.0
    return med, cv


def _row(bench: str, basis: str, times: list[float], **extra: Any) -> dict[str, Any]:
    med, cv = _median_cv(times)
    row = {"bench": bench, "basis": basis, "seconds": med, "cv": cv, **extra}
    if "bytes" in extra and med > 0:
        row["gbps"] = extra["bytes"] / med / 1e9
    return row


class _Timer:
    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any]) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0


def run_micro(cfg: MicroConfig) -> list[dict[str, Any]]:
    """Run the suite; one dict per figure."""
    import torch

    dev = torch.device(pick_device(cfg.device))
    timer = _Timer(dev)
    link = EmulatedCCLink(str(dev), cfg.link) if cfg.mode == "emulated" else None
    rows = _transfers(cfg, dev, timer, link)
    rows += _latencies(cfg, dev, timer, link)
    if dev.type == "cuda":
        rows += _streams(cfg, dev, timer, link)
    rows += [
        _row(
            "aes_gcm_encrypt",
            "measured",
            [c / aes_gcm_throughput(c, total=16 << 20, repeat=1) for _ in range(3)],
            bytes=c,
        )
        for c in cfg.aes_chunks
    ]
    for r in rows:
        r["device"] = str(dev)
    return rows


def _transfers(cfg: MicroConfig, dev: Any, timer: _Timer, link: EmulatedCCLink | None) -> list[dict[str, Any]]:
    import torch

    rows = []
    for n in cfg.sizes:
        dst = torch.empty(n, dtype=torch.uint8, device=dev)
        if link is not None:
            host = torch.randint(0, 256, (n,), dtype=torch.uint8)
            rows.append(
                _row("h2d", "emulated", [link.h2d(host, dst) for _ in range(cfg.repeat)], bytes=n, memory="bounce")
            )
            rows.append(
                _row("d2h", "emulated", [link.d2h(dst, host) for _ in range(cfg.repeat)], bytes=n, memory="bounce")
            )
            continue
        for memory in ("pageable", "pinned") if dev.type == "cuda" else ("pageable",):
            host = torch.randint(0, 256, (n,), dtype=torch.uint8, pin_memory=memory == "pinned")
            up = [timer(_copier(dst, host, memory == "pinned")) for _ in range(cfg.repeat)]
            down = [timer(_copier(host, dst, memory == "pinned")) for _ in range(cfg.repeat)]
            rows += [
                _row("h2d", "measured", up, bytes=n, memory=memory),
                _row("d2h", "measured", down, bytes=n, memory=memory),
            ]
    return rows


def _copier(dst: Any, src: Any, pinned: bool) -> Callable[[], None]:
    def copy() -> None:
        if pinned:
            dst.copy_(src, non_blocking=True)
        else:
            device_copy(dst, src)

    return copy


def _latencies(cfg: MicroConfig, dev: Any, timer: _Timer, link: EmulatedCCLink | None) -> list[dict[str, Any]]:
    import torch

    basis = "emulated" if link is not None else "measured"
    tiny_h, tiny_d = torch.ones(4, dtype=torch.uint8), torch.empty(4, dtype=torch.uint8, device=dev)
    page_h, page_d = torch.ones(4096, dtype=torch.uint8), torch.empty(4096, dtype=torch.uint8, device=dev)
    if link is not None:
        latency = [link.h2d(tiny_h, tiny_d) for _ in range(cfg.small)]
        many = [sum(link.h2d(page_h, page_d) for _ in range(cfg.small)) for _ in range(cfg.repeat)]
    else:
        latency = [timer(_copier(tiny_d, tiny_h, False)) for _ in range(cfg.small)]
        one_page = _copier(page_d, page_h, False)
        many = [timer(lambda: [one_page() for _ in range(cfg.small)]) for _ in range(cfg.repeat)]
    x = torch.zeros(1, device=dev)
    toll = cfg.link.toll_us * 1e-6 if link is not None else 0.0
    launch = [timer(lambda: [x.add_(1) for _ in range(cfg.small)]) / cfg.small + toll for _ in range(cfg.repeat)]
    alloc = [
        timer(lambda: [torch.empty(1 << 20, dtype=torch.uint8, device=dev) for _ in range(cfg.small)]) / cfg.small
        for _ in range(cfg.repeat)
    ]
    many_row = _row("small_copies", basis, many, copies=cfg.small, bytes_each=4096)
    many_row["copies_per_s"] = cfg.small / many_row["seconds"]
    return [
        _row("copy_latency", basis, latency, bytes_each=4),
        many_row,
        _row("launch_latency", basis, launch),
        _row("alloc_1mib", "measured", alloc),
    ]


def _streams(cfg: MicroConfig, dev: Any, timer: _Timer, link: EmulatedCCLink | None) -> list[dict[str, Any]]:
    import torch

    n = max(cfg.sizes)
    host = torch.randint(0, 256, (n,), dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    rows = []
    for k in cfg.streams:
        part = n // k
        if link is not None:  # CC serialises secure copies: k streams cost what one does
            times = [
                sum(link.h2d(host[i * part : (i + 1) * part], dst[i * part : (i + 1) * part]) for i in range(k))
                for _ in range(cfg.repeat)
            ]
            rows.append(_row("streams_h2d", "emulated", times, bytes=part * k, streams=k))
            continue
        streams = [torch.cuda.Stream() for _ in range(k)]

        def go(streams: list[Any] = streams, part: int = part) -> None:
            for i, s in enumerate(streams):
                with torch.cuda.stream(s):
                    dst[i * part : (i + 1) * part].copy_(host[i * part : (i + 1) * part], non_blocking=True)

        rows.append(_row("streams_h2d", "measured", [timer(go) for _ in range(cfg.repeat)], bytes=part * k, streams=k))
    return rows
