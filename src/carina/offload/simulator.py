"""A step of offloaded training, replayed on a timeline (pure Python).

:func:`simulate` plays one optimizer step of a :class:`ModelProfile` under
per-block decisions (:class:`BlockPlan`): a compute stream runs forward,
head and backward events; one link each way carries parameter prefetches,
swapped activations and gradients; a CPU optimizer worker updates each block
once its gradients have arrived (during backward when ``overlap``). The worker's
time is every pass it makes over host memory: folding staged gradients into the
float32 gradient (unless the device folds them, or with one micro-batch sends them in the compute
dtype for the update to upcast: ``ModelProfile.narrow_grads``), adding micro-batches, the
update, and the cast into the compute-dtype host copy (unless the device casts);
each at its measured rate, reported apart in :class:`StepTime`. Host memory is a resource
too: every byte the worker's passes read or write and every pinned DMA byte share its
bandwidth (``Hardware.host_mem``); when the step's host traffic at that bandwidth takes longer
than the worker's passes alone, the passes are slowed to match and the step is at least that
long (the CPU optimizer and the copies contend for the same memory). Each
event records the device bytes live during it and when its block's
parameters became ready, so tests can check that a plan never exceeds its
budget and never computes with parameters before their prefetch completed.
"""

from __future__ import annotations

__all__ = [
    "Action",
    "BlockPlan",
    "BlockProfile",
    "Hardware",
    "ModelProfile",
    "ResidentBytes",
    "SimEvent",
    "StepTime",
    "host_bytes",
    "logits_workspace_bytes",
    "resident_bytes",
    "simulate",
]

from dataclasses import replace

from carina.offload.spillmodel import SpillDisk
from carina.offload.stepmodel import (
    Action,
    BlockPlan,
    BlockProfile,
    Hardware,
    ModelProfile,
    ResidentBytes,
    SimEvent,
    StepTime,
    host_bytes,
    logits_workspace_bytes,
    resident_bytes,
)


def _window(i: int, n: int, depth: int, forward: bool) -> range:
    return range(i, min(n, i + depth + 1)) if forward else range(max(0, i - depth), i + 1)


def _params_live(prof: ModelProfile, blocks: tuple[BlockPlan, ...], window: range) -> int:
    streamed = sum(prof.blocks[j].param_bytes for j in window if not blocks[j].resident)
    resident = sum(b.param_bytes for b, p in zip(prof.blocks, blocks, strict=True) if p.resident)
    return prof.resident_param_bytes + resident + streamed


def _acts_live(prof: ModelProfile, blocks: tuple[BlockPlan, ...], upto: int, forward: bool, lead: int = 1) -> int:
    """Kept activations below ``upto``, its own, and swapped ones in flight beside them.

    Forward: the block below's swap is still draining (earlier ones too, see
    :meth:`_Timeline.draining`); backward: the swapped activations of the ``lead`` blocks
    below are already fetched back.
    """
    kept = sum(prof.blocks[j].act_bytes for j in range(upto) if blocks[j].activation is Action.KEEP)
    current = prof.blocks[upto].act_bytes if upto < len(blocks) else 0
    if forward and upto > 0 and blocks[upto - 1].activation is Action.SWAP:
        current += prof.blocks[upto - 1].act_bytes  # still draining to host
    if not forward:
        below = range(max(0, upto - lead), upto)
        current += sum(prof.blocks[j].act_bytes for j in below if blocks[j].activation is Action.SWAP)
    return kept + current


def _item(param_bytes: int, numel: int) -> int:
    """Bytes per element of the compute dtype."""
    return max(1, param_bytes // max(1, numel))


def _grads_live(prof: ModelProfile, i: int, accumulated: bool, on_nvme: bool = False) -> int:
    nxt = prof.blocks[i + 1].param_bytes if i + 1 < len(prof.blocks) else prof.resident_param_bytes
    live = prof.blocks[i].param_bytes + nxt  # this block's grads + the previous one's, still draining
    item = _item(prof.blocks[i].param_bytes, prof.blocks[i].numel)
    wide = prof.fold_on_device and not accumulated and not prof.narrow(on_nvme)  # float32 copies drain
    return live * 4 // item if wide else live


class _Timeline:
    """Clocks of the compute stream, both links and the CPU worker, plus per-resource totals.

    The CPU worker is one FIFO thread: it folds each non-final micro-batch's
    gradients into the host float32 gradient (``grad_add``) and updates blocks
    (during backward when ``overlap``, else after it); its time counts as
    ``cpu_optimizer``. Blocks accumulating on the device skip both the add and
    the per-micro-batch copy, and ship their float32 sum once.
    """

    def __init__(
        self,
        blocks: tuple[BlockPlan, ...],
        prof: ModelProfile,
        hw: Hardware,
        depth: int,
        overlap: bool,
        carry: bool,
        lead: int = 1,
    ):
        self.blocks, self.prof, self.hw, self.depth, self.overlap = blocks, prof, hw, depth, overlap
        self.lead = lead  # blocks ahead that backward fetches swapped activations back
        self.drains: list[tuple[int, float, int]] = []  # (block, when its swap-out ends, bytes) this forward
        self.act_ready: dict[int, float] = {}  # when each block's swapped activations are back (this backward)
        self.carry = carry and overlap  # updates in next-use order, running on into the next step's forward
        self.tasks: list[tuple[float, float, int, float]] = []  # (gradients ready, seconds, group, disk seconds)
        self.update_end = [0.0] * (len(blocks) + 1)  # when each group's last update ended
        self.gated = False  # this forward waits for the previous step's updates, block by block
        self.now = self.h2d = self.d2h = self.optim = 0.0
        self.ready = [0.0 if p.resident else -1.0 for p in blocks]
        self.totals = dict.fromkeys(("compute", "h2d", "d2h", "cpu_optimizer", "disk"), 0.0)
        self.events: list[SimEvent] = []
        self.deferred: list[tuple[float, float, float]] = []  # (gradients ready, seconds, disk) after backward
        self.disk = SpillDisk(pipelined=prof.spill_pipeline)  # spilled optimizer state's reads and writes
        self.staging_free = [0.0] * (len(blocks) + 1)  # when each group's host staging buffer is free again
        self.acc = sum(4 * b.numel for b, p in zip(prof.blocks, blocks, strict=True) if p.grad_on_device)
        self.final = True
        self.first = True
        self.cpu_terms = dict.fromkeys(("cpu_update", "cpu_fold", "cpu_cast"), 0.0)
        self.traffic = 0  # host memory bytes read or written this step: DMA, the worker's passes, spill I/O

    def fetch_window(self, i: int, forward: bool) -> None:
        for j in _window(i, len(self.blocks), self.depth, forward):
            if self.ready[j] < 0 and self.gated and self.update_end[j] > self.now:
                if j != i:
                    continue  # a look-ahead does not wait for an update; the block's own fetch does
                self.now = self.update_end[j]  # the host blocks until the update is done
            if self.ready[j] < 0:
                b = self.prof.blocks[j]
                wide = self.blocks[j].cast_on_device  # the float32 master crosses, the device casts
                nbytes = 4 * b.numel if wide else b.param_bytes
                dt = nbytes / self.hw.h2d
                self.traffic += nbytes
                self.h2d = max(self.h2d, self.now) + dt
                self.totals["h2d"] += dt
                self.ready[j] = self.h2d

    def draining(self, i: int, ready: float) -> int:
        """Bytes of swapped activations below block ``i - 1`` whose copy to host is still running at its start."""
        start = max(self.now, ready)
        return sum(nbytes for j, end, nbytes in self.drains if j < i - 1 and end > start)

    def run(self, kind: str, i: int, dur: float, device_bytes: int, after: float = 0.0) -> None:
        ready = self.ready[i] if i < len(self.blocks) else 0.0
        start = max(self.now, ready, after)
        self.now = start + dur
        self.totals["compute"] += dur
        self.events.append(SimEvent(kind, i, device_bytes + self.acc, start, self.now, ready))

    def send_d2h(self, nbytes: int) -> float:
        dt = nbytes / self.hw.d2h
        self.traffic += nbytes
        self.d2h = max(self.d2h, self.now) + dt
        self.totals["d2h"] += dt
        return self.d2h

    def cpu(self, ready: float, seconds: float, update: bool, disk: float = 0.0) -> float:
        """Queue CPU work; returns when it ends (updates without overlap wait for the end of backward).

        ``disk``: seconds of spilled optimizer state read before it and written after (:class:`SpillDisk`).
        """
        self.totals["cpu_optimizer"] += seconds
        if update and not self.overlap:
            self.deferred.append((ready, seconds, disk))
            return 0.0
        self.optim = self.disk.run(self.optim, ready, seconds, disk)
        return self.optim

    def gradients(
        self, k: int, numel: int, nbytes: int, on_device: bool, extra: float = 0.0, cast: bool = False
    ) -> None:
        """Group ``k``'s gradients are final for this micro-batch: fold/add them, or update at the end.

        ``cast``: the update is followed by the cast into the compute-dtype host copy.
        """
        if on_device and not self.final:
            return  # added into the device accumulator on the compute stream
        narrow = not on_device and self.prof.narrow(bool(extra))  # compute dtype in, upcast by the update
        direct = on_device or (self.first and self.prof.fold_on_device)  # float32 lands in the host gradient
        ready = self.send_d2h(numel * 4 if direct and not narrow else nbytes)
        fold = 0.0 if direct else numel / (self.hw.fold if self.first else self.hw.grad_add)
        self.cpu_terms["cpu_fold"] += fold
        if not direct:  # the staged gradient read, the float32 gradient written (and read, when adding)
            self.traffic += nbytes + numel * (4 if self.first else 8)
        if self.final:
            update, cast_s = numel / self.hw.optim, numel / self.hw.cast if cast else 0.0
            item = _item(nbytes, numel)
            read = self.prof.update_bytes_per_param - (4 - item if narrow else 0)  # its gradient read narrow
            if narrow:  # the upcast is a pass of its own (no fused kernel reads a narrow gradient): a fold
                update += numel / self.hw.fold  # pass in time, its float32 chunk written and read back
                read += 8  # (the H200 in session 9: 2.88 Gparam/s alone against the float32 update's 4.95)
            self.traffic += numel * (read + (4 + item if cast else 0))
            if extra:  # a spilled block's state is read from NVMe into RAM and written back
                self.traffic += 2 * numel * self.prof.state_bytes_per_param
            self.cpu_terms["cpu_update"] += update
            self.cpu_terms["cpu_cast"] += cast_s
            if self.carry:
                self.totals["cpu_optimizer"] += fold + update + cast_s
                self.tasks.append((ready, fold + update + cast_s, k, extra))
            else:
                self.update_end[k] = self.cpu(ready, fold + update + cast_s, update=True, disk=extra)
            self.totals["disk"] += extra
        elif not direct:
            self.staging_free[k] = self.cpu(ready, fold, update=False)

    def fetch_activations(self, i: int) -> None:
        """Backward enters block ``i``: its swapped activations and the ``lead`` blocks' below come back.

        Issued after the block's parameter fetches, nearest first, each once (the runtime's order).
        """
        for j in (i, *range(i - 1, max(0, i - self.lead) - 1, -1)):
            if self.blocks[j].activation is not Action.SWAP or j in self.act_ready:
                continue
            nbytes = self.prof.blocks[j].act_bytes
            dt = nbytes / self.hw.h2d
            self.traffic += nbytes
            self.h2d = max(self.h2d, self.now) + dt
            self.totals["h2d"] += dt
            self.act_ready[j] = self.h2d

    def refresh_rest(self) -> None:
        """The updated parameters outside blocks go to the device before the first forward (it waits)."""
        prof = self.prof
        wide = prof.rest_cast_on_device and prof.copy_bytes_per_param > 0
        nbytes = 4 * prof.resident_numel if wide else prof.resident_param_bytes
        dt = nbytes / self.hw.h2d
        self.traffic += nbytes
        if self.gated:
            self.now = max(self.now, self.update_end[len(self.blocks)])
        self.h2d = max(self.h2d, self.now) + dt
        self.totals["h2d"] += dt
        self.now = max(self.now, self.h2d)

    def forward(self) -> None:
        prof, blocks, n = self.prof, self.blocks, len(self.blocks)
        if self.first:  # the step's first forward: updated weights go to the device, resident blocks' too
            self.ready = [-1.0] * n
            self.refresh_rest()
        else:
            self.ready = [r if p.resident else -1.0 for r, p in zip(self.ready, blocks, strict=True)]
        for i in range(n):
            self.fetch_window(i, True)
            live = _params_live(prof, blocks, _window(i, n, self.depth, True)) + _acts_live(prof, blocks, i, True)
            self.run("fwd", i, prof.blocks[i].fwd_s, live + self.draining(i, self.ready[i]))
            if blocks[i].activation is Action.SWAP:
                self.drains.append((i, self.send_d2h(prof.blocks[i].act_bytes), prof.blocks[i].act_bytes))
            if i < n - 1 and not blocks[i].resident:
                self.ready[i] = -1.0  # released after forward; the last block stays for backward
        kept = sum(b.act_bytes for b, p in zip(prof.blocks, blocks, strict=True) if p.activation is Action.KEEP)
        live = prof.resident_param_bytes * 2 + prof.other_act_bytes + kept  # swapped ones return in backward
        live += sum(b.param_bytes for b, p in zip(prof.blocks, blocks, strict=True) if p.resident)
        if n and not blocks[-1].resident:
            live += prof.blocks[-1].param_bytes  # the last block stays on the device for backward
        live += prof.head_workspace_bytes + self.draining(n, 0.0)  # the last block's drain, as before, not counted
        self.run("head", n, prof.other_fwd_s * (1 + prof.bwd_over_fwd), live, self.staging_free[n])
        self.drains = []
        cast = prof.copy_bytes_per_param > 0 and not prof.rest_cast_on_device
        self.gradients(n, prof.resident_numel, prof.resident_param_bytes, False, cast=cast)

    def backward(self) -> None:
        prof, blocks, n = self.prof, self.blocks, len(self.blocks)
        for i in reversed(range(n)):
            self.fetch_window(i, False)
            self.fetch_activations(i)
            act_ready = self.act_ready.pop(i, 0.0)
            dur = prof.blocks[i].fwd_s * (prof.bwd_over_fwd + (blocks[i].activation is Action.RECOMPUTE))
            live = (
                _params_live(prof, blocks, _window(i, n, self.depth, False))
                + _acts_live(prof, blocks, i, False, self.lead)
                + prof.other_act_bytes
                + _grads_live(prof, i, blocks[i].grad_on_device, blocks[i].state_on_nvme)
            )
            staged = 0.0 if blocks[i].grad_on_device else self.staging_free[i] - dur  # the grad hook waits
            self.run("bwd", i, dur, live, max(act_ready, staged))
            disk = (
                2 * prof.blocks[i].numel * prof.state_bytes_per_param / self.hw.disk if blocks[i].state_on_nvme else 0.0
            )
            b = prof.blocks[i]
            cast = prof.copy_bytes_per_param > 0 and not blocks[i].cast_on_device
            self.gradients(i, b.numel, b.param_bytes, blocks[i].grad_on_device, disk, cast)

    def schedule(self) -> None:
        """Run the final updates on the worker in next-use order (the parameters outside blocks first)."""
        n, t, tasks = len(self.blocks), self.optim, sorted(self.tasks)
        while tasks:
            ready = [x for x in tasks if x[0] <= t] or [tasks[0]]
            pick = min(ready, key=lambda x: -1 if x[2] == n else x[2])
            tasks.remove(pick)
            t = self.disk.run(t, pick[0], pick[1], pick[3])
            self.update_end[pick[2]] = t
        self.optim, self.tasks = t, []

    def step(self) -> float:
        """Play every micro-batch of the step; returns when the last update ends."""
        self.disk.ahead = self.now  # spilled state may be read ahead from the step's first forward on
        for m in range(self.prof.micro_batches):
            self.final = m == self.prof.micro_batches - 1
            self.first = m == 0
            self.forward()
            self.gated = False
            self.backward()
        self.schedule()
        end = max(self.now, self.d2h)
        for ready, seconds, disk in self.deferred:
            end = self.disk.run(end, ready, seconds, disk)
        return max(end, self.optim, self.disk.settled)  # step() waits for the spilled state's last writes


def simulate(
    blocks: tuple[BlockPlan, ...],
    prof: ModelProfile,
    hw: Hardware,
    depth: int,
    overlap: bool = True,
    carry: bool = False,
    act_lead: int = 1,
) -> tuple[list[SimEvent], StepTime]:
    """Replay one step of ``prof`` under ``blocks``.

    With ``carry`` (and ``overlap``) the worker updates blocks in next-use order and
    ``optimizer.step()`` does not wait for them: the next step's forward fetches each block
    once its update is done. The step is then played twice and the prediction is the second
    one's length in steady state (its events and totals are the second step's).

    Args:
        blocks: One decision per profiled block.
        prof: The profile.
        hw: Rates of the links and the CPU optimizer.
        depth: Prefetch depth in blocks.
        overlap: Whether the optimizer updates blocks during backward.
        carry: Whether those updates may run on into the next step (see above).
        act_lead: Blocks ahead that backward fetches swapped activations back (each fetched
            block's bytes are live from then on).

    Returns:
        The compute events (live device bytes, times) and the predicted step time.
    """
    tl, step = _play(blocks, prof, hw, depth, overlap, carry, act_lead)
    host_s = tl.traffic / hw.host_mem if hw.host_mem > 0 else 0.0
    stretch = host_s / tl.totals["cpu_optimizer"] if tl.totals["cpu_optimizer"] > 0 else 1.0
    if stretch > 1:  # the worker's passes share host memory with the DMA: slowed to the traffic's time
        slow = replace(hw, optim=hw.optim / stretch, fold=hw.fold / stretch, grad_add=hw.grad_add / stretch,
                       cast=hw.cast / stretch)  # fmt: skip
        tl, step = _play(blocks, prof, slow, depth, overlap, carry, act_lead)
    terms = {**tl.totals, "host_memory": host_s}
    bottleneck = max(terms, key=lambda k: terms[k])
    if stretch > 1 and bottleneck == "cpu_optimizer":
        bottleneck = "host_memory"  # the worker waits on memory bandwidth, not on its arithmetic
    tot, cpu = tl.totals, tl.cpu_terms
    time = StepTime(compute=tot["compute"], h2d=tot["h2d"], d2h=tot["d2h"], cpu_optimizer=tot["cpu_optimizer"],
                    disk=tot["disk"], predicted=max(step, host_s), bottleneck=bottleneck, cpu_update=cpu["cpu_update"],
                    cpu_fold=cpu["cpu_fold"], cpu_cast=cpu["cpu_cast"], host_memory=host_s, host_traffic=tl.traffic,
                    host_bandwidth=hw.host_mem)  # fmt: skip
    return tl.events, time


def _play(
    blocks: tuple[BlockPlan, ...], prof: ModelProfile, hw: Hardware, depth: int, overlap: bool, carry: bool, lead: int
) -> tuple[_Timeline, float]:
    """One step on a fresh timeline (two with ``carry``: the second, in steady state); its length."""
    tl = _Timeline(blocks, prof, hw, depth, overlap, carry, lead)
    step = tl.step()
    if tl.carry:
        tl.events, tl.gated = [], True
        tl.totals = dict.fromkeys(tl.totals, 0.0)
        tl.cpu_terms = dict.fromkeys(tl.cpu_terms, 0.0)
        tl.traffic = 0
        end = max(step, tl.now)
        step = tl.step() - end
    return tl, step
