"""Verifiable IO workloads: a deterministic byte pattern and timed read/write cases.

Every 8-byte word of a test file holds its own index XOR a per-seed key, so any
range can be checked without keeping a copy: :func:`expected` rebuilds it.
:func:`run_case` drives an engine with sequential or random requests of one
block size at one queue depth, times only the IO, and checks every byte read.
Used by ``carina io bench`` and ``benchmarks/io``.
"""

from __future__ import annotations

import enum
import itertools
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from carina.core.errors import ConfigError, IOEngineError
from carina.io._buffers import aligned_buffer
from carina.io._engine import IOEngine
from carina.io._handle import FileHandle

__all__ = ["Access", "CaseResult", "expected", "fill_file", "parse_size", "run_case"]

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """``4K``, ``1MiB``, ``512`` -> bytes (binary units).

    Raises:
        ConfigError: Not a size.
    """
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ConfigError(f"{text!r} is not a size like 4K, 1M or 2G", key="size")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


class Access(enum.Enum):
    """Request order of a case."""

    SEQ = "seq"
    RAND = "rand"


def expected(offset: int, nbytes: int, seed: int = 0) -> np.ndarray:
    """The pattern bytes of ``[offset, offset + nbytes)`` (offset and size multiples of 8)."""
    if offset % 8 or nbytes % 8:
        raise ConfigError("pattern ranges are 8-byte aligned", key="offset")
    words = np.arange(offset // 8, (offset + nbytes) // 8, dtype=np.uint64)
    words ^= _key(seed)
    return words.view(np.uint8)


def fill_file(engine: IOEngine, handle: FileHandle, size: int, *, seed: int = 0, chunk: int = 4 << 20) -> None:
    """Write the pattern over ``[0, size)`` and fsync."""
    pending = []
    for off in range(0, size, chunk):
        buf = aligned_buffer(min(chunk, size - off))
        buf[:] = expected(off, buf.nbytes, seed)
        pending.append(engine.write(handle, off, buf))
        if len(pending) >= 8:
            pending.pop(0).result()
    for fut in pending:
        fut.result()
    engine.fsync(handle)


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one case."""

    kind: str
    access: str
    block: int
    queue_depth: int
    ops: int
    bytes: int
    seconds: float
    verified_bytes: int

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth over the timed IO."""
        return self.bytes / self.seconds if self.seconds else 0.0

    @property
    def iops(self) -> float:
        """Requests per second over the timed IO."""
        return self.ops / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with the derived rates."""
        return {**asdict(self), "bytes_per_s": self.bytes_per_s, "iops": self.iops}


def _offsets(access: Access, block: int, size: int, count: int, start: int, rng: np.random.Generator) -> np.ndarray:
    slots = size // block
    if access is Access.SEQ:
        return ((start + np.arange(count)) % slots) * block
    return rng.integers(0, slots, count) * block


def run_case(
    engine: IOEngine,
    handle: FileHandle,
    *,
    kind: str,
    access: Access,
    block: int,
    queue_depth: int,
    seconds: float,
    seed: int = 0,
    verify: bool = True,
    lanes: int = 2,
    rows: int | None = None,
) -> CaseResult:
    """Run one case for about ``seconds``; every byte read is checked against the pattern.

    ``queue_depth`` requests stay outstanding in ``lanes`` batches that take
    turns: while the oldest is waited for, checked and refilled, the others are
    in the kernel (a batch completes only with its slowest request, so more
    lanes keep the device busier). With ``rows``, each batch holds that many
    requests instead and the engine's own ``queue_depth`` bounds how many are
    in the kernel (the way a large gather runs).
    Reads use :meth:`IOEngine.gather`; writes :meth:`IOEngine.write_batch` with
    the pattern, so the file stays verifiable. Verification runs inside the
    timed loop (overlapped with the other batch's IO).

    Raises:
        IOEngineError: A request failed or a byte read differs from the pattern.
    """
    if block % 8 or block <= 0 or handle.size < block or kind not in ("read", "write"):
        raise ConfigError("block must be a positive multiple of 8 that fits the file", key="block")
    rng = np.random.default_rng(seed + 1)
    lanes = max(1, min(lanes, queue_depth))
    half = rows or max(1, queue_depth // lanes)
    dests = [aligned_buffer(block * half) for _ in range(lanes)]
    batches: list[tuple[Any, np.ndarray] | None] = [None] * lanes
    ops = verified = 0
    t0 = time.perf_counter()
    stop = t0 + seconds
    for turn in itertools.count():
        slot = turn % lanes
        batch = batches[slot]
        if batch is not None:
            ops, verified = _settle(batch, dests[slot], kind, block, seed, handle, verify, ops, verified)
            batches[slot] = None
        if time.perf_counter() >= stop:
            if all(b is None for b in batches):
                break
            continue
        offs = _offsets(access, block, handle.size, half, turn * half, rng)
        batches[slot] = (_issue(engine, handle, kind, offs, block, dests[slot], seed), offs)
    return CaseResult(kind, access.value, block, queue_depth, ops, ops * block, time.perf_counter() - t0, verified)


def _issue(
    engine: IOEngine, handle: FileHandle, kind: str, offs: np.ndarray, block: int, dest: np.ndarray, seed: int
) -> Any:
    if kind == "read":
        return engine.gather(handle, offs, block, dest)
    dest[:] = _pattern_rows(offs, block, seed).reshape(-1)
    rows = dest.reshape(len(offs), block)
    return engine.write_batch([(handle, off, rows[i]) for i, off in enumerate(offs.tolist())], coalesce=False)


def _settle(
    batch: tuple[Any, np.ndarray],
    dest: np.ndarray,
    kind: str,
    block: int,
    seed: int,
    handle: FileHandle,
    verify: bool,
    ops: int,
    verified: int,
) -> tuple[int, int]:
    pending, offs = batch
    for fut in pending if isinstance(pending, list) else [pending]:
        fut.result()
    if kind == "read" and verify:
        rows = dest.reshape(len(offs), block)
        bad = np.flatnonzero((rows != _pattern_rows(offs, block, seed)).any(axis=1))
        if len(bad):
            raise IOEngineError(
                "bytes read differ from the pattern written", path=str(handle.path), offset=int(offs[bad[0]])
            )
        verified += len(offs) * block
    return ops + len(offs), verified


def _pattern_rows(offs: np.ndarray, block: int, seed: int) -> np.ndarray:
    first = offs.astype(np.uint64) // np.uint64(8)
    words = np.bitwise_xor(first[:, None] + np.arange(block // 8, dtype=np.uint64), _key(seed))
    return words.view(np.uint8).reshape(len(offs), block)


def _key(seed: int) -> np.uint64:
    """A per-seed constant XORed into every word (word = its index ^ key: unique per offset)."""
    return np.uint64((seed * 0x9E3779B97F4A7C15 + 0x5851F42D4C957F2D) & 0xFFFFFFFFFFFFFFFF)
