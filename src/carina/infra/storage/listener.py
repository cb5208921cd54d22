"""The NBD listener: accepts clients and gives each an :class:`~carina.infra.storage.server.NbdConnection`."""

from __future__ import annotations

import asyncio
from typing import Any

from carina.infra.storage import protocol as p
from carina.infra.storage.server import NbdConnection
from carina.infra.storage.stats import TierStats
from carina.infra.storage.tier import Tier

__all__ = ["NbdServer"]


class NbdServer:
    """Listens for NBD clients and serves one export from a :class:`Tier`."""

    def __init__(self, tier: Tier, *, export: str, stats: TierStats | None = None) -> None:
        self.tier = tier
        self.export = export
        self.stats = stats or TierStats()
        self.connections: set[NbdConnection] = set()
        self.accepted = 0
        self._servers: list[asyncio.Server] = []
        self.ports: list[int] = []

    @property
    def transmission_flags(self) -> int:
        """Flags advertised with the export."""
        return p.TRANSMISSION_FLAGS

    async def listen(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Start listening on ``host:port`` (0 picks a port); return the port.

        ``reuse_port``: share the port with other front-end processes (``SO_REUSEPORT``).
        """
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: NbdConnection(self), host, port, reuse_address=True, reuse_port=reuse_port or None
        )
        self._servers.append(server)
        bound = int(server.sockets[0].getsockname()[1])
        self.ports.append(bound)
        return bound

    async def adopt(self, sock: Any) -> None:
        """Serve a client socket accepted elsewhere (a front end's balanced accept loop)."""
        await asyncio.get_running_loop().connect_accepted_socket(lambda: NbdConnection(self), sock)

    async def close(self) -> None:
        """Stop listening, finish in-flight requests, close connections."""
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn._disconnect()
        pending = [t for c in list(self.connections) for t in c._tasks]
        if pending:
            await asyncio.wait(pending, timeout=30)
        for conn in list(self.connections):
            conn.close()
        for server in self._servers:
            await server.wait_closed()
