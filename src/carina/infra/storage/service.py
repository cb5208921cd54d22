"""Running the tier: open the store, start the engine, listen, publish live stats, shut down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

from carina.core.errors import BackendUnavailable
from carina.infra.storage.config import LoopKind, TierConfig
from carina.infra.storage.listener import NbdServer
from carina.infra.storage.stats import TierStats, write_stats_file
from carina.infra.storage.tier import Tier

__all__ = ["loop_factory", "run", "serve"]


async def serve(
    config: TierConfig,
    *,
    ready: Callable[[NbdServer], None] | None = None,
    stop: asyncio.Event | None = None,
    on_stats: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM in the main thread); return final stats.

    Args:
        config: The tier.
        ready: Called with the server once it listens (its ``ports`` are bound).
        stop: Set it to shut down; one is made if not given.
        on_stats: Called with each live-stats snapshot.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    tier = Tier.open(config)
    stats = TierStats()
    server = NbdServer(tier, export=config.server.export, stats=stats)
    stats_path = config.store.path / "stats.json"
    handled: list[signal.Signals] = []
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
        await server.listen(config.server.host, config.server.port)
        if ready is not None:
            ready(server)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.server.stats_interval)
            snap = _snapshot(stats, tier)
            write_stats_file(stats_path, snap)
            if on_stats is not None:
                on_stats(snap)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await server.close()
        tier.close()
    final = _snapshot(stats, tier)
    write_stats_file(stats_path, final)
    return final


def _snapshot(stats: TierStats, tier: Tier) -> dict[str, Any]:
    """Live stats plus the engine's batching and warm-up (:meth:`PayloadEngine.report`)."""
    return {**stats.snapshot(tier.store), **tier.engine.report()}


def loop_factory(kind: LoopKind) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event-loop constructor ``kind`` names.

    Raises:
        BackendUnavailable: ``uvloop`` was asked for and is not installed.
    """
    if kind == LoopKind.ASYNCIO:
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if kind == LoopKind.UVLOOP:
            raise BackendUnavailable("uvloop is not installed: pip install 'carina[infra]'") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(config: TierConfig, **kwargs: Any) -> dict[str, Any]:
    """Blocking :func:`serve` on the configured event loop."""
    with asyncio.Runner(loop_factory=loop_factory(config.server.loop)) as runner:
        return runner.run(serve(config, **kwargs))
