"""Which of a batch's jobs a ZVC device batch takes, grouped by operation and block length.

:class:`~carina.infra.storage.zvcbatch.ZvcBatcher` runs one kernel sequence per *group* (jobs of one
operation and block length). A GPU engine's batches are small (4.5 jobs a batch for 64 KiB reads on the
H200 in session 12, 13 at 4 KiB), and at that size a numpy pass over a job table costs more host time
than reading the job tuples once: each numpy call costs microseconds, more when the caches are cold,
and the table plus the checks take about 25 of them. So batches of up to :data:`PY_PLAN_MAX` jobs are
planned in one Python pass over the tuples (:func:`plan_small`), larger ones by numpy over the job
table (:func:`plan_table`); both give the same :class:`Plan`, which carries each group's source and
destination offsets, its decoding metadata and whether its blocks lie back to back, so nothing
downstream derives them again::

    plan = plan_jobs(jobs, arena_size, raw_reads=True)
    for g in plan.groups:
        g.op, g.length, g.rows, g.src, g.dst, g.meta, g.src_run, g.dst_run
    plan.bad     # malformed ZVC jobs (ERR_CORRUPT); plan.other: jobs of other codecs, for the CPU
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from carina.infra.storage.blockcodec import Codec, Job, Op, job_groups, job_table

__all__ = ["PY_PLAN_MAX", "Group", "Plan", "plan_jobs", "plan_small", "plan_table"]

#: Largest batch planned by one Python pass over the job tuples (larger ones: numpy over the job table).
PY_PLAN_MAX = 64

_COMPRESS, _DECOMPRESS, _ZVC, _RAW = int(Op.COMPRESS), int(Op.DECOMPRESS), int(Codec.ZVC), int(Codec.RAW)


@dataclass(slots=True)
class Group:
    """Jobs of one operation and block length, in batch order.

    Attributes:
        op: The operation (:class:`~carina.infra.storage.blockcodec.Op`).
        length: Block length in bytes (a multiple of 8, at least 8).
        rows: The jobs' positions in the batch.
        src: Their source offsets in the arena.
        dst: Their destination offsets.
        meta: To decode: codec, stored length and expected CRC of each job, flat (3 per job); else empty.
        src_run: Whether the sources lie back to back in order (one copy reads them all).
        dst_run: Whether the destinations do.
        tail: Whether a source block runs past the arena's end (a stored block shorter than its row).
    """

    op: int
    length: int
    rows: Any = field(default_factory=list)
    src: Any = field(default_factory=list)
    dst: Any = field(default_factory=list)
    meta: Any = field(default_factory=list)
    src_run: bool = True
    dst_run: bool = True
    tail: bool = False


@dataclass(slots=True)
class Plan:
    """A batch's groups (ascending by operation, then block length) and the jobs the device does not take."""

    groups: list[Group]
    bad: list[int]
    other: list[int]


def plan_jobs(jobs: Sequence[Job], size: int, *, raw_reads: bool) -> Plan:
    """:func:`plan_small` for up to :data:`PY_PLAN_MAX` jobs, else :func:`plan_table`."""
    if len(jobs) <= PY_PLAN_MAX:
        return plan_small(jobs, size, raw_reads=raw_reads)
    return plan_table(jobs, size, raw_reads=raw_reads)


def plan_small(jobs: Sequence[Job], size: int, *, raw_reads: bool) -> Plan:
    """The plan in one pass over the job tuples (see :func:`plan_table` for the rules)."""
    groups: dict[tuple[int, int], Group] = {}
    bad: list[int] = []
    other: list[int] = []
    for i, (op, codec, so, sl, do, dl, crc) in enumerate(jobs):
        if op == _COMPRESS:
            length, ok = sl, codec == _ZVC and dl >= sl
        else:
            length = dl
            ok = op == _DECOMPRESS and sl <= dl and (codec == _ZVC or (raw_reads and codec == _RAW and sl == dl))
        if ok and length >= 8 and not length & 7 and so >= 0 and do >= 0 and so + sl <= size and do + length <= size:
            g = groups.get((op, length))
            if g is None:
                g = groups[(op, length)] = Group(int(op), int(length))
            elif g.src_run or g.dst_run:
                g.src_run = g.src_run and so == g.src[-1] + length
                g.dst_run = g.dst_run and do == g.dst[-1] + length
            g.rows.append(i)
            g.src.append(so)
            g.dst.append(do)
            if op == _DECOMPRESS:
                g.meta += (codec, sl, crc)
                if so + length > size:
                    g.tail = True
        elif codec == _ZVC:
            bad.append(i)
        else:
            other.append(i)
    return Plan([groups[k] for k in sorted(groups)], bad, other)


def plan_table(jobs: Sequence[Job], size: int, *, raw_reads: bool) -> Plan:
    """The plan by numpy over the ``(n, 7)`` job table.

    A job goes to the device if it compresses ZVC into a destination at least as long as the block, or
    decompresses a stored ZVC block (or, with ``raw_reads``, a raw one of exactly the block's length)
    no longer than its destination; its block length (the source's to compress, the destination's to
    decompress) is a multiple of 8 and at least 8; and both regions lie inside the arena. Other ZVC jobs
    are malformed (``bad``); jobs of other codecs are left to the CPU (``other``).
    """
    a = job_table(jobs)
    op, codec, so, sl, do, dl = a.T[:6]
    zvc = codec == _ZVC
    comp = op == _COMPRESS
    length = np.where(comp, sl, dl)
    readable = zvc | ((codec == _RAW) & (sl == dl)) if raw_reads else zvc
    ok = np.where(comp, zvc & (dl >= sl), (op == _DECOMPRESS) & (sl <= dl) & readable)
    ok &= (np.maximum(so + sl, do + length) <= size) & ((so | do | (length - 8)) >= 0) & ((length & 7) == 0)
    idx = np.flatnonzero(ok)
    groups = []
    for key, rows in job_groups(idx, (op[idx] << 40) | length[idx]):
        g = Group(key >> 40, key & ((1 << 40) - 1), rows, so[rows], do[rows])
        g.meta = a[rows][:, [1, 3, 6]].reshape(-1) if g.op == _DECOMPRESS else []
        g.src_run, g.dst_run = _one_run(g.src, g.length), _one_run(g.dst, g.length)
        g.tail = bool((g.src > size - g.length).any())
        groups.append(g)
    rest = np.flatnonzero(~ok)
    is_zvc = zvc[rest]
    return Plan(groups, rest[is_zvc].tolist(), rest[~is_zvc].tolist())


def _one_run(offsets: np.ndarray, length: int) -> bool:
    """Whether blocks of ``length`` bytes at ``offsets`` lie back to back, in order."""
    return len(offsets) < 2 or bool((offsets[1:] - offsets[:-1] == length).all())
