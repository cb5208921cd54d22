"""Block codecs on the CPU and the job format every payload engine runs.

A job names two regions of a shared arena (offsets and lengths) and what to do
between them, so the same job runs in-process, in a worker process that maps
the same arena, or on a GPU::

    Job    = (op, codec, src_off, src_len, dst_off, dst_cap, crc)
    Result = (codec, out_len, crc)        # out_len < 0: an error code below

Compressing a block yields ``out_len == 0`` for an all-zero block (stored as a
hole), the raw bytes with ``Codec.RAW`` when compression does not shrink it,
and always the CRC-32 of what is stored. Decompressing checks that CRC first.
"""

from __future__ import annotations

import enum
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from carina.core.errors import BackendUnavailable

__all__ = [
    "ERR_CHECKSUM",
    "ERR_CORRUPT",
    "Codec",
    "Job",
    "Op",
    "Result",
    "block_compressor",
    "block_decompressor",
    "codec_available",
    "compress_block",
    "decompress_block",
    "job_groups",
    "job_table",
    "run_cpu_jobs",
]


class Codec(enum.IntEnum):
    """How a stored block is encoded (the number is written to disk)."""

    RAW = 0
    ZLIB = 1
    LZ4 = 2
    ZSTD = 3
    ZVC = 4  # zero-value compression: bitmap of non-zero bytes + those bytes (torch, batched)
    DEFLATE = 5  # raw deflate (RFC 1951, no zlib header): what nvCOMP's deflate writes and reads


class Op(enum.IntEnum):
    """What a job does."""

    COMPRESS = 0
    DECOMPRESS = 1


Job = tuple[int, int, int, int, int, int, int]
Result = tuple[int, int, int]

#: Decompression found a stored CRC mismatch.
ERR_CHECKSUM = -1
#: The codec failed or produced the wrong length.
ERR_CORRUPT = -2

_PYPI = {Codec.LZ4: "lz4", Codec.ZSTD: "zstandard", Codec.ZVC: "torch"}


def codec_available(codec: Codec) -> str | None:
    """``None`` when ``codec`` can run here, else the reason it cannot."""
    module = _PYPI.get(codec)
    if module is None:
        return None
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return f"{codec.name.lower()} needs the {module} package: pip install 'carina[infra]'"
    return None


_LOCAL = threading.local()


def _zstd() -> tuple[Any, Any]:
    """This thread's zstd contexts (zstandard's contexts must not be shared between threads)."""
    ctx = getattr(_LOCAL, "zstd", None)
    if ctx is None:
        try:
            import zstandard
        except ImportError as exc:
            raise BackendUnavailable("zstd needs zstandard: pip install 'carina[infra]'") from exc
        ctx = _LOCAL.zstd = (zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor())
    return ctx


def _lz4() -> Any:
    try:
        import lz4.block
    except ImportError as exc:
        raise BackendUnavailable("lz4 needs lz4: pip install 'carina[infra]'") from exc
    return lz4.block


def block_compressor(codec: Codec) -> Callable[[memoryview], bytes]:
    """The per-block CPU compressor of ``codec`` (raises BackendUnavailable when its package is missing)."""
    if codec == Codec.LZ4:
        block = _lz4()
        return lambda src: block.compress(src, store_size=False)
    if codec == Codec.ZSTD:
        return _zstd()[0].compress
    if codec == Codec.ZLIB:
        return lambda src: zlib.compress(src, 1)
    if codec == Codec.DEFLATE:
        return _deflate
    raise BackendUnavailable(f"codec {codec.name} has no per-block CPU compressor")


def _deflate(src: memoryview) -> bytes:
    """Raw deflate at level 1 (window 2**15, no header or trailer)."""
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    return c.compress(src) + c.flush()


def block_decompressor(codec: Codec) -> Callable[[memoryview, int], bytes]:
    """The per-block CPU decompressor of ``codec``: ``(stored, block length) -> block``."""
    if codec == Codec.LZ4:
        block = _lz4()
        return lambda src, n: block.decompress(src, uncompressed_size=n)
    if codec == Codec.ZSTD:
        dctx = _zstd()[1]
        return lambda src, n: dctx.decompress(src, max_output_size=n)
    if codec == Codec.ZLIB:
        return lambda src, n: zlib.decompress(src, bufsize=n)
    if codec == Codec.DEFLATE:
        return lambda src, n: zlib.decompress(src, -15, n)
    raise BackendUnavailable(f"codec {codec.name} has no per-block CPU decompressor")


def is_zero(block: memoryview) -> bool:
    """Whether every byte of ``block`` is zero (vectorised)."""
    arr = np.frombuffer(block, dtype=np.uint64 if len(block) % 8 == 0 else np.uint8)
    return not arr.any()


def compress_block(codec: Codec, src: memoryview, dst: memoryview) -> Result:
    """Compress ``src`` into ``dst`` (which holds at least ``len(src)`` bytes)."""
    if is_zero(src):
        return (Codec.RAW, 0, 0)
    out: bytes | memoryview = src
    used = Codec.RAW
    if codec != Codec.RAW:
        packed = block_compressor(codec)(src)
        if len(packed) < len(src):
            out, used = packed, codec
    n = len(out)
    dst[:n] = out
    return (int(used), n, zlib.crc32(dst[:n]))


def decompress_block(codec: Codec, src: memoryview, dst: memoryview, crc: int) -> Result:
    """Check ``src`` against ``crc`` and decompress it into all of ``dst``."""
    if zlib.crc32(src) != crc:
        return (int(codec), ERR_CHECKSUM, 0)
    if codec == Codec.RAW:
        if len(src) != len(dst):
            return (int(codec), ERR_CORRUPT, 0)
        dst[:] = src
        return (int(codec), len(dst), crc)
    try:
        out = block_decompressor(codec)(src, len(dst))
    except Exception:  # noqa: BLE001 - any codec failure means corrupt input
        return (int(codec), ERR_CORRUPT, 0)
    if len(out) != len(dst):
        return (int(codec), ERR_CORRUPT, 0)
    dst[:] = out
    return (int(codec), len(dst), crc)


#: Codec by number: a dict lookup per job instead of ``Codec(n)`` (enum code in Python); unknown numbers still
#: go through ``Codec(n)``, which raises.
_CODECS = {int(c): c for c in Codec}


def run_cpu_jobs(arena: memoryview, jobs: Sequence[Job]) -> list[Result]:
    """Run ``jobs`` against ``arena`` here, one block at a time on the CPU.

    ZVC jobs want the torch codec: :func:`carina.infra.storage.codecs.run_jobs` sends them there.
    """
    results: list[Result] = []
    for op, codec, so, sl, do, dl, crc in jobs:
        src, dst = arena[so : so + sl], arena[do : do + dl]
        if op == Op.COMPRESS:
            results.append(compress_block(_CODECS.get(codec) or Codec(codec), src, dst))
        else:
            results.append(decompress_block(_CODECS.get(codec) or Codec(codec), src, dst, crc))
    return results


def job_table(jobs: Sequence[Job]) -> np.ndarray:
    """``jobs`` as one ``(n, 7)`` int64 array (a row per job, its fields in :data:`Job` order)."""
    import itertools

    n = len(jobs)
    return np.fromiter(itertools.chain.from_iterable(jobs), dtype=np.int64, count=7 * n).reshape(n, 7)


def job_groups(idx: np.ndarray, key: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The rows ``idx`` split by ``key`` (one key per row of ``idx``): ``(key, rows)`` per distinct key, ascending."""
    return [(k, idx[key == k]) for k in np.unique(key).tolist()]
