"""Fixed-shape device steps replayed as CUDA graphs, so a small batch costs one launch, not dozens.

A batch of a few 4 KiB blocks runs dozens of small kernels (ZVC packing or
decoding, the CRC-32 matrix products, the status arithmetic); launched one by
one from Python each costs tens of microseconds of host time, which at queue
depth 32 sets the pace (measured on the H200: about 2.6 ms of host time per
batch of ~8 reads). :class:`GraphRunner` captures such a step once per row
count *bucket* (the next power of two) and launch thread, then replays it:
the batch's inputs are copied into the graph's static inputs (padding rows
keep stale values; their outputs are dropped) unless the caller put them there itself
(:meth:`GraphRunner.inputs`), one replay runs every kernel,
and the outputs are views of the graph's static outputs, valid until the next
replay of the same graph on the same thread. Off CUDA, for buckets larger
than ``max_bytes`` of rows, or where capture fails, the step runs eagerly
(same results)::

    runner = GraphRunner()
    blocks, res = runner(("zvc-unpack", 4096), unpack_step, (rows, meta), stream=stream)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, cast

__all__ = ["GraphRunner", "bucket_of"]

log = logging.getLogger("carina.infra.storage")

_CAPTURE = threading.Lock()
"""One capture at a time in the process. ``torch.cuda.graph`` synchronizes the device and empties the
allocator's cache before it begins, which invalidates a capture running on another launch thread
(s14 H100, two launch threads per front end: ``cudaErrorStreamCaptureInvalidated`` at 4 KiB)."""


def bucket_of(n: int) -> int:
    """The row count a batch of ``n`` rows is padded to (the next power of two)."""
    return 1 << max(n - 1, 0).bit_length()


class GraphRunner:
    """Runs ``fn(*args)`` (tensors with ``n`` rows in, tensors with ``n`` rows out) as one CUDA graph replay.

    Args:
        max_bytes: Largest bucket (rows x bytes per row of the first argument) worth a graph; larger
            batches run eagerly (their launches are few against their work).

    Attributes:
        replays: Graph replays so far; ``eager``: steps run without a graph (tests and benchmarks read them).
    """

    def __init__(self, *, max_bytes: int = 2 << 20) -> None:
        self.max_bytes = max_bytes
        self.replays = 0
        self.eager = 0
        self._local = threading.local()
        self._broken: set[Hashable] = set()

    def __call__(self, key: Hashable, fn: Callable[..., tuple[Any, ...]], args: Sequence[Any], *,
                 stream: Any = None) -> tuple[Any, ...]:  # fmt: skip
        """``fn(*args)``, through this thread's graph for ``key`` and the batch's bucket when it can."""
        first = args[0]
        if stream is None or not first.is_cuda:  # off CUDA: no more questions (the launch thread's time)
            self.eager += 1
            return fn(*args)
        n = first.shape[0]
        bucket = bucket_of(n)
        row_bytes = first.numel() // n * first.element_size() if n else 0
        if bucket * row_bytes > self.max_bytes or (key, bucket) in self._broken:
            self.eager += 1
            return fn(*args)
        graphs: dict[Hashable, Any] = self._local.__dict__.setdefault("graphs", {})
        entry = graphs.get((key, bucket))
        if entry is None:
            entry = self._capture(key, bucket, fn, args, stream)
            if entry is None:
                self.eager += 1
                return fn(*args)
            graphs[(key, bucket)] = entry
        graph, statics, outs, _ = entry
        for static, arg in zip(statics, args, strict=True):
            if arg.data_ptr() != static.data_ptr():  # not already there (see :meth:`inputs`)
                static[:n].copy_(arg, non_blocking=True)
        graph.replay()
        self.replays += 1
        return tuple(out[:n] for out in outs)

    def inputs(self, key: Hashable, n: int) -> tuple[Any, ...] | None:
        """The first ``n`` rows of this thread's static inputs of the graph for ``key`` and ``n`` rows.

        ``None`` until that graph is captured (the first call for its bucket). A caller that copies a
        batch's inputs straight into them and passes them as the step's arguments saves the copies
        :meth:`__call__` makes otherwise, one device-to-device copy (and host call) per argument.
        """
        graphs = self._local.__dict__.get("graphs")
        entry = graphs.get((key, bucket_of(n))) if graphs else None
        if entry is None:
            return None
        views = entry[3]
        got = views.get(n)
        if got is None:
            got = views[n] = tuple(static[:n] for static in entry[1])
        return cast(tuple[Any, ...], got)

    def _capture(self, key: Hashable, bucket: int, fn: Callable[..., tuple[Any, ...]], args: Sequence[Any],
                 stream: Any) -> tuple[Any, list[Any], tuple[Any, ...], dict[int, Any]] | None:  # fmt: skip
        """Capture ``fn`` on static inputs of ``bucket`` rows; ``None`` (and eager from now on) if it fails."""
        import torch

        statics = [torch.zeros((bucket, *a.shape[1:]), dtype=a.dtype, device=a.device) for a in args]
        try:
            with _CAPTURE, torch.cuda.stream(stream):
                for static, arg in zip(statics, args, strict=True):  # warm-up on real rows: lazy inits happen here
                    static[: arg.shape[0]].copy_(arg)
                fn(*statics)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    outs = fn(*statics)
        except RuntimeError as exc:  # a step that cannot be captured still runs, eagerly
            log.warning("CUDA graph capture of %s (%d rows) failed, running it eagerly: %s", key, bucket, exc)
            self._broken.add((key, bucket))
            return None
        return graph, statics, tuple(outs), {}
