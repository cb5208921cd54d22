"""The spill pipeline (:mod:`carina.offload.spill`) on the simulator's timeline.

A block whose optimizer state spills to NVMe costs its update a read of that state before and a
write after, ``disk`` seconds in all (half each way: ``Hardware.disk`` is one rate). Without the
pipeline (``pipelined=False``, carina before session 11) the updating thread does all three in
series. With it, there is one slot of host RAM and one disk clock: a block's read starts once the
last spilled block's writes have ended and, from the step's first forward on, without waiting for its
update to be asked for; its update starts when the read has ended and the worker is free; its writes
run beside the update, tensor by tensor, and end no earlier than the update (``step()`` waits for the
last ones). Modeled, not measured: the writes are taken to start with the update (the runtime starts
each tensor's write once that tensor is updated, smallest first), and the disk never reads and writes
at once.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpillDisk"]


@dataclass
class SpillDisk:
    """The disk's clock for spilled optimizer state, and the rule that runs a task beside it.

    Attributes:
        pipelined: Reads ahead and write-back beside the update (else read, update, write in series).
        free: When the last spilled block's writes end (the slot is free again).
        ahead: From when reads may run ahead of their update (the current step's first forward).
    """

    pipelined: bool = True
    free: float = 0.0
    ahead: float = 0.0

    def run(self, worker: float, ready: float, cpu: float, disk: float = 0.0) -> float:
        """Run a task on the CPU worker; when it ends.

        Args:
            worker: When the worker is free.
            ready: When the task's inputs (its gradients) are there.
            cpu: The worker's seconds for it.
            disk: Seconds to read and write back its block's spilled state (0: none spills).
        """
        if not disk or not self.pipelined:
            return max(worker, ready) + cpu + disk
        read_end = max(self.free, self.ahead) + disk / 2
        start = max(worker, ready, read_end)
        self.free = max(start + disk / 2, start + cpu)
        return start + cpu

    @property
    def settled(self) -> float:
        """When the last writes end (a pipelined step ends no earlier)."""
        return self.free if self.pipelined else 0.0
