"""Batched row gathers at ids that may live on the device: one post/wait interface, two paths.

``RowGather(engine, handle, RowGatherConfig(row_bytes=..., max_rows=..., device=...))``
reads rows of a file into a tensor at row ids given as a tensor::

    with RowGather(eng, eng.open("rows.bin", "r"), RowGatherConfig(row_bytes=512, max_rows=64)) as g:
        ticket = g.post(ids, dest)   # ids and dest on the device
        g.wait(ticket)               # the current stream (on CPU: the host) waits for the rows
        print(g.path, g.selection.explain())

``path`` picks the implementation:

* ``gpu``: :class:`~carina.io.CamGather`, the GPU-initiated path (the ids stay
  on the device; a stream memory operation rings a doorbell; the host never
  synchronises with the GPU);
* ``host``: :class:`~carina.io._hostgather.HostGather`, the host-initiated path
  (the host reads the ids, the engine gathers into pinned staging, the waiting
  stream copies to ``dest``);
* ``auto`` (the default): ``host`` wherever it can run, else ``gpu``. The choice
  follows ``benchmarks/results/h200/io_cam_h200.json`` (session 7, both paths
  through this class, five rounds of the four passes in rotating order, 64
  batches of 1024 rows of 4 KiB beside matmuls): the host path was faster in
  every round (medians 0.792 s against 0.801 s, 1.0%), inside the noise band,
  and both ran at 96-97% of the bound max(IO alone, compute alone). The
  GPU-initiated path stays one argument away (``path="gpu"``) for programs
  whose ids are made on the device and must not be read by the host.

:func:`choose_gather_path` says which path ``auto`` takes and why it skipped
the other; ``carina doctor`` and ``carina io probe`` show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from carina.core.backend import Backend, Selection, select_backend
from carina.core.errors import BackendUnavailable, ConfigError
from carina.io._cam import CamConfig, CamGather, CamTicket
from carina.io._hostgather import HostGather

if TYPE_CHECKING:
    from carina.io._engine import IOEngine
    from carina.io._handle import FileHandle

__all__ = ["PATHS", "RowGather", "RowGatherConfig", "choose_gather_path", "gather_path_report"]

PATHS = ("auto", "gpu", "host")
#: The order ``auto`` tries the paths in (the first that can run is taken); see the module docstring.
AUTO_ORDER = ("host", "gpu")
AUTO_EVIDENCE = (
    "benchmarks/results/h200/io_cam_h200.json (session 7): host-initiated gathers faster than GPU-initiated in "
    "every one of 5 rounds (1.0% by the medians, inside the noise); the GPU-initiated path is path='gpu'"
)


@dataclass(kw_only=True)
class RowGatherConfig(CamConfig):
    """Settings of a :class:`RowGather`: :class:`~carina.io.CamConfig`'s, and ``path``.

    Attributes:
        path: ``auto`` (default), ``gpu`` (GPU-initiated) or ``host`` (host-initiated).
    """

    path: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.path not in PATHS:
            raise ConfigError(f"path must be one of {', '.join(PATHS)}", key="path", value=self.path)


class _Path(Backend):
    """One gather path under consideration: its name and the reasons against it."""

    def __init__(self, name: str, reasons: list[str]) -> None:
        self.name = name  # type: ignore[misc]
        self.reasons = reasons

    def unsupported_reasons(self, request: Any = None) -> list[str]:
        """Reasons found when the path was considered."""
        return self.reasons


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def choose_gather_path(path: str = "auto", *, device: str = "cuda") -> Selection[_Path]:
    """Which gather path ``path`` resolves to for a destination on ``device``, and why.

    Raises:
        BackendUnavailable: The named path (or, for ``auto``, both) cannot run here.
    """
    from carina.io._memops import memops_unavailable_reason

    cuda = device != "cpu"
    gpu: list[str] = []
    if path == "auto" and not cuda:
        gpu.append("the destination is on the CPU: the GPU-initiated path is for CUDA destinations")
    if cuda or path == "auto":
        why = memops_unavailable_reason()
        if why:
            gpu.append(f"CUDA stream memory operations unavailable: {why}")
    host = [f"no CUDA device for a {device} destination"] if cuda and not _cuda_visible() else []
    candidates = {"gpu": _Path("gpu", gpu), "host": _Path("host", host)}
    return select_backend([candidates[p] for p in AUTO_ORDER] if path == "auto" else [candidates[path]])


def gather_path_report(device: str | None = None) -> dict[str, Any]:
    """What ``carina doctor``/``carina io probe`` show: the path ``auto`` takes here and why.

    Args:
        device: The destination's device; default ``cuda`` where CUDA is visible, else ``cpu``.
    """
    device = device or ("cuda" if _cuda_visible() else "cpu")
    try:
        selection = choose_gather_path("auto", device=device)
    except BackendUnavailable as exc:
        return {"device": device, "path": None, "why": str(exc), "skipped": {}}
    name = selection.backend.name
    if name == "host":
        why = f"host-initiated for a {device} destination; {AUTO_EVIDENCE}"
    else:
        why = "host-initiated path skipped: " + "; ".join(selection.skipped.get("host", []))
    return {"device": device, "path": name, "why": why, "skipped": selection.skipped}


class RowGather:
    """Rows of one file gathered at ids that may live on the device (see the module docstring).

    Args:
        engine: The engine that performs the reads.
        handle: The file, opened for reading.
        config: Row size, most rows per request, requests in flight, device, path.

    Attributes:
        path: The path in use, ``gpu`` or ``host``.
        selection: Why (``selection.explain()``, ``selection.skipped``).

    Raises:
        BackendUnavailable: The named path (or, for ``auto``, both) cannot run here.
    """

    def __init__(self, engine: IOEngine, handle: FileHandle, config: RowGatherConfig) -> None:
        self.config = config
        self.selection = choose_gather_path(config.path, device=config.device)
        self.path = self.selection.backend.name
        self._impl: CamGather | HostGather = (CamGather if self.path == "gpu" else HostGather)(engine, handle, config)

    @property
    def stats(self) -> dict[str, int]:
        """Counters of the path in use (``posted``, ``served``, ...)."""
        return self._impl.stats

    def post(self, ids: Any, dest: Any) -> CamTicket:
        """Ask for rows ``ids`` (1-D int64 tensor on the device) into ``dest`` (contiguous, same device).

        On the ``gpu`` path with CUDA this only enqueues work on the current
        stream; on the ``host`` path the host reads the ids (it waits for the
        current stream to produce them). Either path blocks while ``slots``
        requests are outstanding.

        Raises:
            ConfigError: Bad ids or destination.
            IOEngineError: The gather is closed.
        """
        return self._impl.post(ids, dest)

    def wait(self, ticket: CamTicket, stream: Any = None) -> None:
        """Make ``stream`` (default: current) wait for ``ticket``'s rows; on CPU the host waits.

        A failed request raises here (naming the request) on the ``host`` path
        and on CPU; on the ``gpu`` path with CUDA the stream is released with
        the rows undefined and the error is raised by :meth:`host_wait`.
        """
        self._impl.wait(ticket, stream)

    def host_wait(self, ticket: CamTicket, timeout: float | None = None) -> None:
        """Block the host until ``ticket``'s rows are in ``dest``; raise its error if its read failed."""
        self._impl.host_wait(ticket, timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Stop the path (the ``gpu`` path serves what was posted first; no thread is left)."""
        self._impl.close(timeout)

    def __enter__(self) -> RowGather:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
