"""Where the hosts of a multi-host disagg job are: a hostfile, or ``env://`` (torch.distributed's variables).

A hostfile has one host per line, ``host[:port] slots=N``; ``#`` starts a comment and blank lines
are skipped. The line order gives the node ranks (first line: rank 0); the first host is the
rendezvous of the cross-host PS groups (shard *s* listens on ``port + s``, default port 29650),
so a port is only allowed on the first line. ``slots`` is the number of workers on that host and
must be the same on every line (the global batch is sliced as ``node_rank · workers + rank``)::

    10.0.0.1:29650 slots=8   # node rank 0, the rendezvous
    10.0.0.2 slots=8         # node rank 1

``env://`` reads torch.distributed's variables, one launcher per host: ``MASTER_ADDR`` and
``MASTER_PORT`` (the rendezvous), ``WORLD_SIZE`` (the number of hosts) and ``RANK`` (this host's
rank). :func:`from_env` takes the environment as a mapping, so it is read in one place and typed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from carina.core.config import Config, require
from carina.core.errors import ConfigError

__all__ = ["DEFAULT_PORT", "HostEntry", "Rendezvous", "from_env", "from_hostfile", "parse_hostfile", "resolve"]

DEFAULT_PORT = 29650  # DisaggConfig.master_port's default
_HOST = re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::(?P<port>[0-9]{1,5}))?"
)
_COUNT = re.compile(r"[0-9]{1,6}")


@dataclass(frozen=True, kw_only=True)
class HostEntry:
    """One hostfile line: the host, its port (or None), its worker slots and its line number."""

    host: str
    port: int | None
    slots: int
    line: int


@dataclass(kw_only=True)
class Rendezvous(Config):
    """Where this host stands in a multi-host job.

    Attributes:
        hosts: Hosts in the job.
        host_rank: This host's rank.
        master_addr: The rendezvous host (node rank 0).
        master_port: The rendezvous port (shard s uses ``master_port + s``).
        slots: Workers per host when the hostfile says so (None: take ``--workers``).
    """

    hosts: int
    host_rank: int
    master_addr: str
    master_port: int = DEFAULT_PORT
    slots: int | None = None

    def validate(self) -> None:
        """A host rank inside the host count, a usable port, positive slots."""
        require(self.hosts >= 1, "need at least one host", key="hosts")
        require(0 <= self.host_rank < self.hosts, f"node rank must be in 0..{self.hosts - 1}", key="node_rank")
        require(1 <= self.master_port <= 65535, "port must be in 1..65535", key="master_port")
        require(bool(self.master_addr), "the rendezvous address is empty", key="master_addr")
        require(self.slots is None or self.slots >= 1, "slots must be >= 1", key="slots")

    def apply(self, cfg: Any) -> Any:
        """``cfg`` (a :class:`~carina.offload.disagg.DisaggConfig`) placed in this job."""
        workers = cfg.workers if self.slots is None else self.slots
        return replace(
            cfg,
            hosts=self.hosts,
            host_rank=self.host_rank,
            master_addr=self.master_addr,
            master_port=self.master_port,
            workers=workers,
        )


def _bad(source: str, line: int, message: str) -> ConfigError:
    return ConfigError(f"{source}:{line}: {message}", key="hosts", path=source, line=line)


def _parse_line(body: str, line: int, source: str) -> HostEntry:
    fields = body.split()
    match = _HOST.fullmatch(fields[0])
    if match is None:
        raise _bad(source, line, f"{fields[0]!r} is not host or host:port")
    port = None if match["port"] is None else int(match["port"])
    if port is not None and not 1 <= port <= 65535:
        raise _bad(source, line, f"port {port} is not in 1..65535")
    slots = None
    for item in fields[1:]:
        key, eq, value = item.partition("=")
        if key != "slots" or not eq:
            raise _bad(source, line, f"unknown field {item!r} (a line is 'host[:port] slots=N')")
        if slots is not None:
            raise _bad(source, line, "slots given twice")
        if _COUNT.fullmatch(value) is None or int(value) < 1:
            raise _bad(source, line, f"slots={value!r} is not a positive count")
        slots = int(value)
    if slots is None:
        raise _bad(source, line, "missing slots=N (the workers on this host)")
    return HostEntry(host=match["host"], port=port, slots=slots, line=line)


def parse_hostfile(text: str, *, source: str = "<hostfile>") -> list[HostEntry]:
    """Parse a hostfile's text (line numbers count ``\\n`` as editors do).

    Args:
        text: The file's contents.
        source: The file's name, quoted in errors as ``source:line``.

    Raises:
        ConfigError: A malformed line, a port after the first line, slots that differ between
            lines, or no host at all; the message starts with ``source:line``.
    """
    entries: list[HostEntry] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        body = raw.split("#", 1)[0].strip()
        if body:
            entries.append(_parse_line(body, number, source))
    if not entries:
        raise ConfigError(f"{source}: no hosts (a line is 'host[:port] slots=N')", key="hosts", path=source)
    first = entries[0]
    for entry in entries[1:]:
        if entry.port is not None:
            raise _bad(source, entry.line, "only the first host (the rendezvous) may name a port")
        if entry.slots != first.slots:
            raise _bad(
                source,
                entry.line,
                f"slots={entry.slots} differs from slots={first.slots} on line {first.line}: "
                "every host runs the same number of workers",
            )
    return entries


def from_hostfile(path: Path | str, node_rank: int) -> Rendezvous:
    """The rendezvous of node ``node_rank`` in the hostfile at ``path``.

    Raises:
        ConfigError: The file cannot be read or parsed, or ``node_rank`` is not one of its lines.
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read hostfile {path}: {exc}", key="hosts", path=str(path)) from None
    entries = parse_hostfile(text, source=str(path))
    if not 0 <= node_rank < len(entries):
        raise ConfigError(
            f"node rank {node_rank} is not in 0..{len(entries) - 1} ({path} lists {len(entries)} hosts)",
            key="node_rank",
        )
    head = entries[0]
    return Rendezvous(
        hosts=len(entries),
        host_rank=node_rank,
        master_addr=head.host,
        master_port=head.port or DEFAULT_PORT,
        slots=entries[node_rank].slots,
    )


def _env_int(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name)
    if raw is None:
        raise ConfigError(f"env:// needs {name} in the environment", key=name)
    if _COUNT.fullmatch(raw.strip()) is None:
        raise ConfigError(f"env://: {name}={raw!r} is not a non-negative integer", key=name)
    return int(raw.strip())


def from_env(environ: Mapping[str, str]) -> Rendezvous:
    """The rendezvous from torch.distributed's ``env://`` variables in ``environ``.

    ``MASTER_ADDR``/``MASTER_PORT`` name the rendezvous, ``WORLD_SIZE`` the number of hosts and
    ``RANK`` this host's rank (one ``carina train`` launcher per host, not per process).

    Raises:
        ConfigError: A variable is missing or not a valid value; ``key`` names it.
    """
    addr = environ.get("MASTER_ADDR", "").strip()
    if not addr:
        raise ConfigError("env:// needs MASTER_ADDR in the environment", key="MASTER_ADDR")
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"  # an IPv6 address, bracketed for tcp://addr:port
    match = _HOST.fullmatch(addr)
    if match is None or match["port"] is not None:
        raise ConfigError(f"env://: MASTER_ADDR={addr!r} is not a host name or address", key="MASTER_ADDR")
    port, world, rank = (_env_int(environ, n) for n in ("MASTER_PORT", "WORLD_SIZE", "RANK"))
    if not 1 <= port <= 65535:
        raise ConfigError(f"env://: MASTER_PORT={port} is not in 1..65535", key="MASTER_PORT")
    if world < 1 or rank >= world:
        raise ConfigError(f"env://: RANK={rank} must be < WORLD_SIZE={world} (hosts)", key="RANK")
    return Rendezvous(hosts=world, host_rank=rank, master_addr=addr, master_port=port)


def resolve(
    *, hostfile: Path | None, node_rank: int | None, rdzv: str | None, environ: Mapping[str, str]
) -> Rendezvous | None:
    """The command line's multi-host options as a :class:`Rendezvous` (None: one host).

    Raises:
        ConfigError: Both a hostfile and ``--rdzv``, a hostfile without ``--node-rank``,
            ``--node-rank`` alone, or an ``--rdzv`` other than ``env://``.
    """
    if hostfile is not None and rdzv is not None:
        raise ConfigError("give either --hosts FILE or --rdzv env://, not both", key="rdzv")
    if rdzv is not None:
        if rdzv != "env://":
            raise ConfigError(f"--rdzv {rdzv!r}: only env:// is supported (or use --hosts FILE)", key="rdzv")
        if node_rank is not None:
            raise ConfigError("with --rdzv env:// the node rank is $RANK, not --node-rank", key="node_rank")
        return from_env(environ)
    if hostfile is not None:
        if node_rank is None:
            raise ConfigError(f"--hosts {hostfile} needs --node-rank (this host's line, from 0)", key="node_rank")
        return from_hostfile(hostfile, node_rank)
    if node_rank is not None:
        raise ConfigError("--node-rank needs --hosts FILE", key="node_rank")
    return None
