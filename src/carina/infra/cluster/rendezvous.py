"""Where the ranks of a multi-node check meet: ``env://`` (torchrun) or a hostfile.

A hostfile lists one node per line (``host`` or ``host:port``; ``#`` starts a comment). The
first node hosts the rendezvous; a node's rank is its line, found by its host name or address
unless ``--rank`` says so (several ranks on one host, as in tests).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from carina.core.errors import ConfigError, ModelFormatError

__all__ = ["Rendezvous", "from_hostfile"]

DEFAULT_PORT = 29540


@dataclass(frozen=True)
class Rendezvous:
    """How this process joins the group: torch.distributed init method, rank and world size."""

    init_method: str
    rank: int | None  # None: from the environment (env://)
    world: int | None


def _parse(path: Path) -> list[tuple[str, int]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read hostfile: {exc.strerror}", key=str(path)) from exc
    nodes = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, port = line.partition(":")
        if not host or any(c.isspace() for c in host) or (port and not port.isdigit()):
            raise ModelFormatError(f"not a 'host' or 'host:port' line: {raw!r}", file=str(path), line=number)
        nodes.append((host, int(port) if port else DEFAULT_PORT))
    if not nodes:
        raise ModelFormatError("hostfile lists no nodes", file=str(path))
    return nodes


def _my_rank(nodes: list[tuple[str, int]], path: Path) -> int:
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    matches = [i for i, (host, _) in enumerate(nodes) if host in names]
    if len(matches) != 1:
        raise ConfigError(
            f"cannot tell this node's rank: its names {sorted(names)} match {len(matches)} lines; pass --rank",
            key=str(path),
        )
    return matches[0]


def from_hostfile(spec: str, *, rank: int | None = None) -> Rendezvous:
    """``env://`` as is, or the rendezvous a hostfile describes for this node."""
    if spec == "env://":
        return Rendezvous("env://", None, None)
    path = Path(spec)
    nodes = _parse(path)
    me = _my_rank(nodes, path) if rank is None else rank
    if not 0 <= me < len(nodes):
        raise ConfigError(f"rank {me} outside the {len(nodes)} nodes of the hostfile", key="rank")
    host, port = nodes[0]
    return Rendezvous(f"tcp://{host}:{port}", me, len(nodes))
