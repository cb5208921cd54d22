"""Lending an offloaded optimizer's host state to a checkpointer instead of copying it in ``save()``.

The float32 masters and AdamW moments of an offloaded model already live in host RAM. A checkpointer
that copies them behind training (``carina.ckpt``'s lazy host copies) borrows them with
:meth:`StateLending.lend_state` and registers a guard that every in-place write calls first (block
updates on the optimizer worker, ``load_state_dict``), so an update waits only until its own bytes
are copied. carina.ckpt finds the method by name; neither package imports the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from carina.offload.blocks import ParamGroup
    from carina.offload.runtime import OffloadRuntime
    from carina.offload.spill import SpillPipeline

__all__ = ["StateLending"]


class StateLending:
    """Mixed into :class:`carina.offload.session.OffloadOptimizer`: the state-lending protocol."""

    rt: OffloadRuntime
    inner: torch.optim.Optimizer
    spill_pipe: SpillPipeline

    def _written_by(self, g: ParamGroup) -> list[torch.Tensor]:
        """The host tensors an update of ``g`` writes in place: its masters, its optimizer state, the spill buffer."""
        state = [t for mp in g.masters for t in self.inner.state.get(mp, {}).values() if isinstance(t, torch.Tensor)]
        buf = self.spill_pipe.buffer
        return [g.master, *state, *([buf] if buf is not None else [])]

    @contextlib.contextmanager
    def lend_state(self, guard: Callable[[list[torch.Tensor]], None]) -> Iterator[list[torch.Tensor]]:
        """Inside, ``model.state_dict()`` and :meth:`state_dict` give the live host tensors, not copies.

        A checkpointer that copies them behind training uses this: from now on (until
        :meth:`remove_write_guard`) ``guard(tensors)`` is called, on whichever thread updates, before
        any of the yielded tensors' storage is written in place; it returns once their bytes are copied.
        Yields those tensors (the masters and the optimizer state in host RAM).
        """
        for g in self.rt.groups:
            self.rt.wait_updates(g)
        self.spill_pipe.settle()
        if guard not in self.rt.write_guards:
            self.rt.write_guards.append(guard)
        self.rt.lend_views = True
        try:
            yield [t for g in self.rt.groups for t in self._written_by(g) if t is not self.spill_pipe.buffer]
        finally:
            self.rt.lend_views = False

    def remove_write_guard(self, guard: Callable[[list[torch.Tensor]], None]) -> None:
        """Stop calling ``guard`` (registered by :meth:`lend_state`)."""
        if guard in self.rt.write_guards:
            self.rt.write_guards.remove(guard)
