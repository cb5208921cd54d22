"""Typed configs of the storage middle tier: store, payload engine, front end."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path

from carina.core.config import Config, require
from carina.core.errors import ConfigError
from carina.infra.storage.codecs import Codec
from carina.infra.storage.cudawait import CudaWait

__all__ = [
    "CodecName",
    "EngineConfig",
    "EngineKind",
    "LoopKind",
    "Overflow",
    "ServerConfig",
    "StoreConfig",
    "TierConfig",
    "parse_size",
]


class CodecName(enum.Enum):
    """Codec used for new blocks (stored blocks keep the codec they were written with)."""

    RAW = "raw"
    ZLIB = "zlib"
    LZ4 = "lz4"
    ZSTD = "zstd"
    ZVC = "zvc"
    DEFLATE = "deflate"

    @property
    def codec(self) -> Codec:
        """The on-disk codec id."""
        return Codec[self.name]


class LoopKind(enum.Enum):
    """The event loop of the front end."""

    AUTO = "auto"  # uvloop when installed, else asyncio
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class EngineKind(enum.Enum):
    """Where payloads are (de)compressed."""

    INLINE = "inline"  # in the front end's own thread: header and payload in one process
    THREAD = "thread"  # a pool of threads in the same process (the codecs release the GIL)
    PROCESS = "process"  # a pool of worker processes sharing the payload arena
    TORCH = "torch"  # batched torch kernels (ZVC) on a GPU, or on the CPU with the same code
    NVCOMP = "nvcomp"  # nVIDIA nvCOMP batched LZ4 / zstd / deflate on a GPU (many blocks per launch)


class Overflow(enum.Enum):
    """What the CPU pools do with jobs when every worker is busy."""

    QUEUE = "queue"  # queue them for the pool (the event loop only parses and replies)
    LOOP = "loop"  # run them in the event loop's thread (the loop is one more worker, with no handoff)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """Parse ``4096``, ``64K``, ``1M``, ``2G`` (binary units) into bytes.

    Raises:
        ConfigError: The text is not a size.
    """
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not m:
        raise ConfigError(f"{text!r} is not a size like 64K or 1G", key="size")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(kw_only=True)
class StoreConfig(Config):
    """The back end: compressed blocks in an append-only log plus a block map.

    Attributes:
        path: Directory holding ``data.log`` and ``map.bin``.
        size: Export size in bytes (fixed when the store is created).
        block_size: Unit of compression and of the block map (power of two, 512 B to 1 MiB).
        codec: Codec for newly written blocks.
        checkpoint_bytes: Log growth after which a FLUSH also rewrites the block map.
    """

    path: Path = Path("carina-store")
    size: int = 1 << 30
    block_size: int = 64 << 10
    codec: CodecName = CodecName.LZ4
    checkpoint_bytes: int = 256 << 20

    def validate(self) -> None:
        """Check sizes."""
        require(
            _power_of_two(self.block_size) and 512 <= self.block_size <= 1 << 20,
            "block_size must be a power of two between 512 B and 1 MiB",
            key="block_size",
        )
        require(self.size > 0 and self.size % self.block_size == 0, "size must be a multiple of block_size", key="size")
        require(self.checkpoint_bytes > 0, "checkpoint_bytes must be positive", key="checkpoint_bytes")


@dataclass(kw_only=True)
class EngineConfig(Config):
    """The payload engine.

    Attributes:
        kind: ``inline``, ``thread``, ``process`` or ``torch``.
        workers: Threads of the ``thread`` engine, worker processes of the ``process`` engine, launch
            threads (each with its own CUDA stream) of the ``torch`` engine.
        device: Torch device of the ``torch`` and ``nvcomp`` engines (``auto``: CUDA when present, else CPU).
        inflight: Most batches in flight at once; jobs submitted while that many run wait and leave together
            as the next batch (``None``: the engine's default, one per launch thread for ``torch`` and
            ``nvcomp``, no limit for the CPU pools; ``0``: no limit).
        overflow: For the ``thread`` and ``process`` pools: ``queue`` jobs for busy workers, or run in the
            event loop's thread (``loop``) what no idle worker takes, so ``workers`` threads plus the loop
            use ``workers + 1`` cores.
        loop_below: For the ``thread`` and ``process`` pools: a request whose jobs all decompress blocks
            smaller than this, or blocks stored raw, runs in the event loop, not the pool (a handoff costs
            more than decompressing a 4 KiB block; session 6 measured it); ``0``: every job goes to the pool.
        cuda_wait: For the ``torch`` and ``nvcomp`` engines on CUDA: how launch threads wait for the device,
            ``spin`` (CUDA's default) or ``block`` (blocking sync; see :mod:`carina.infra.storage.cudawait`).
    """

    kind: EngineKind = EngineKind.PROCESS
    workers: int = 2
    device: str = "auto"
    inflight: int | None = None
    overflow: Overflow = Overflow.QUEUE
    loop_below: int = 16 << 10
    cuda_wait: CudaWait = CudaWait.SPIN

    def validate(self) -> None:
        """Check the worker count."""
        require(self.loop_below >= 0, "loop_below must be >= 0", key="loop_below")
        require(1 <= self.workers <= 256, "workers must be between 1 and 256", key="workers")
        require(self.inflight is None or 0 <= self.inflight <= 4096, "inflight must be 0..4096", key="inflight")
        gpu = self.kind in (EngineKind.TORCH, EngineKind.NVCOMP)
        require(gpu or self.cuda_wait is CudaWait.SPIN, "cuda_wait=block is for the torch and nvcomp engines",
                key="cuda_wait")  # fmt: skip
        cpu_pool = self.kind in (EngineKind.THREAD, EngineKind.PROCESS)
        require(
            cpu_pool or self.overflow == Overflow.QUEUE,
            "overflow=loop is for the thread and process pools",
            key="overflow",
        )


@dataclass(kw_only=True)
class ServerConfig(Config):
    """The NBD front end.

    Attributes:
        host: Address to listen on.
        port: TCP port (0 picks a free one).
        export: Export name clients ask for (``nbd://host:port/<export>``).
        slots: Payload buffers in the arena: requests in flight before reading pauses.
        slot_bytes: Payload bytes one slot holds; larger requests are processed in pieces.
        loop: Event loop (``auto``: uvloop when installed).
        stats_interval: Seconds between live-stats snapshots (written to ``<store>/stats.json``).
    """

    host: str = "127.0.0.1"
    port: int = 10809
    export: str = "carina"
    slots: int = 32
    slot_bytes: int = 1 << 20
    loop: LoopKind = LoopKind.AUTO
    stats_interval: float = 1.0

    def validate(self) -> None:
        """Check ranges."""
        require(0 <= self.port < 65536, "port must be 0..65535", key="port")
        require(0 < len(self.export.encode()) <= 4096, "export name must be 1..4096 bytes", key="export")
        require(1 <= self.slots <= 4096, "slots must be 1..4096", key="slots")
        require(_power_of_two(self.slot_bytes), "slot_bytes must be a power of two", key="slot_bytes")
        require(self.stats_interval > 0, "stats_interval must be positive", key="stats_interval")


@dataclass(kw_only=True)
class TierConfig(Config):
    """The whole middle tier: store, engine and front end."""

    store: StoreConfig = field(default_factory=StoreConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    def validate(self) -> None:
        """Check that the pieces fit together."""
        require(
            self.server.slot_bytes >= self.store.block_size,
            "server.slot_bytes must be at least store.block_size",
            key="server.slot_bytes",
        )
        if self.store.codec == CodecName.ZVC:
            require(self.store.block_size % 8 == 0, "zvc needs block_size % 8 == 0", key="store.codec")
