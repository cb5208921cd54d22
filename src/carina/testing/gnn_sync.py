"""Count the operations that make the host wait for a CUDA device, on any device (CPU tests included).

A CPU run has no device to wait for, so wall time cannot show a host synchronisation; the operations
that cause one on CUDA can be counted instead. :func:`count_host_syncs` records, inside its block:

* through a :class:`torch.utils._python_dispatch.TorchDispatchMode`, every aten call whose output
  size or value the host must read on CUDA: ``nonzero``, ``masked_select``, ``unique`` in each form,
  ``bincount`` (it reads the input's maximum), a tensor's value on the host (``item``, ``int(t)``,
  ``bool(t)``: ``_local_scalar_dense``), indexing or index-assignment with a boolean mask, and
  ``repeat_interleave`` without ``output_size``;
* every call of :func:`carina.gnn.hostread.host_ints` and :func:`carina.gnn.hostread.to_host`, the
  gnn code's deliberate reads of device values (``tolist`` and ``cpu()`` do not reach the dispatcher
  for a CPU tensor).

::

    with count_host_syncs() as syncs:
        sampler.sample(seeds)
    assert syncs.total == len(sampler.fanouts) + 1
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncs", "count_host_syncs"]

_ALWAYS = frozenset(
    {
        "nonzero",
        "nonzero_static",
        "nonzero_numpy",
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "bincount",
        "_local_scalar_dense",
    }
)
_MASKED = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


class HostSyncs:
    """What :func:`count_host_syncs` saw: one entry per operation, by name."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Every counted operation."""
        return sum(self.ops.values())

    def add(self, name: str) -> None:
        """Count one ``name``."""
        self.ops[name] += 1


def _syncs(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    name = func.overloadpacket.__name__
    if name in _ALWAYS:
        return name
    if name in _MASKED and len(args) > 1:
        indices = args[1] if isinstance(args[1], list | tuple) else []
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return f"{name}[mask]"
    # repeat_interleave.Tensor(repeats) and .self_Tensor(self, repeats, dim): the output's size is the
    # repeats' sum, read on the host unless output_size is given (an int ``repeats`` needs no read)
    if name == "repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor"):
        at = 1 if func._overloadname == "Tensor" else 3
        if kwargs.get("output_size", args[at] if len(args) > at else None) is None:
            return "repeat_interleave(no output_size)"
    return None


class _Mode(TorchDispatchMode):
    def __init__(self, seen: HostSyncs) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        reason = _syncs(func, args, kwargs)
        if reason is not None:
            self.seen.add(reason)
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_host_syncs() -> Iterator[HostSyncs]:
    """Count, inside the block, the operations that wait for a CUDA device (module docstring)."""
    from carina.gnn import hostread

    seen = HostSyncs()
    saved = {name: getattr(hostread, name) for name in ("host_ints", "to_host")}

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.add(name)
            return fn(*args, **kwargs)

        return call

    for name, fn in saved.items():
        setattr(hostread, name, counted(name, fn))
    try:
        with _Mode(seen):
            yield seen
    finally:
        for name, fn in saved.items():
            setattr(hostread, name, fn)
