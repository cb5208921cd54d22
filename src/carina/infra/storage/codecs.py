"""Block codecs and the job format every payload engine runs, and :func:`run_jobs`.

The codecs and the job format live in :mod:`carina.infra.storage.blockcodec`
(named here too); :func:`run_jobs` runs a list of jobs here, the ZVC ones as
batches of the torch codec (:mod:`carina.infra.storage.zvcbatch`), the others
block by block on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from carina.infra.storage.blockcodec import (
    ERR_CHECKSUM,
    ERR_CORRUPT,
    Codec,
    Job,
    Op,
    Result,
    block_compressor,
    block_decompressor,
    codec_available,
    compress_block,
    decompress_block,
    job_groups,
    job_table,
    run_cpu_jobs,
)

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
    "run_jobs",
]


def run_jobs(arena: memoryview, jobs: Sequence[Job], *, device: str = "cpu") -> list[Result]:
    """Run ``jobs`` against ``arena`` here; ZVC jobs go to the torch codec on ``device`` as one batch."""
    results: list[Result | None] = [None] * len(jobs)
    zvc = [i for i, job in enumerate(jobs) if job[1] == Codec.ZVC and job[0] == Op.COMPRESS]
    zvc += [i for i, job in enumerate(jobs) if job[1] == Codec.ZVC and job[0] == Op.DECOMPRESS]
    if zvc:
        from carina.infra.storage.zvcbatch import run_zvc_jobs

        for i, res in zip(zvc, run_zvc_jobs(arena, [jobs[i] for i in zvc], device=device), strict=True):
            results[i] = res
    rest = [i for i, res in enumerate(results) if res is None]
    for i, res in zip(rest, run_cpu_jobs(arena, [jobs[i] for i in rest]), strict=True):
        results[i] = res
    return [r for r in results if r is not None]
