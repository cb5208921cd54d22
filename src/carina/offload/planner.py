"""The offload planner: pure Python, from a profile and budgets to a plan.

Given a :class:`ModelProfile` (per block: parameter bytes, saved activation
bytes, forward time), :class:`PlanBudgets` and :class:`Hardware` (measured
bandwidths and CPU optimizer throughput), :func:`make_plan` decides for every
block whether its parameters stay on the device or stream in
``prefetch_depth`` blocks ahead of use, whether its activations are kept,
swapped to host RAM or recomputed, whether its gradients accumulate over
micro-batches in a float32 device buffer (only its final sum crosses PCIe)
or on the host, whether its updated float32 masters are cast into a host copy
by the CPU or fetched as float32 and cast on the device, and whether its
optimizer state lives in host RAM or spills to NVMe. Every candidate is replayed by
:func:`~carina.offload.simulator.simulate`; a choice is accepted only when its
simulated device peak and host bytes fit their budgets and its simulated step
is no slower (Ratel's traffic-aware rule: relieve the busiest resource). A
configuration that cannot fit raises :class:`CapacityError` saying what would.

Before any of that, with ``resident`` on or auto, :func:`resident_plan` checks whether the whole
training state fits the device (:func:`~carina.offload.simulator.resident_bytes`: parameters,
float32 masters when the compute dtype is narrower, gradients, optimizer state, every block's
activations kept, the head's workspace). When it does, the plan's mode is
:attr:`PlanMode.RESIDENT`: nothing is offloaded and the model trains as plain PyTorch would
(:mod:`carina.offload.resident`); no offloaded plan can beat it, since it moves nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from carina.core.errors import CapacityError
from carina.memory.tiers import format_bytes
from carina.offload.simulator import (
    Action,
    BlockPlan,
    Hardware,
    ModelProfile,
    ResidentBytes,
    SimEvent,
    StepTime,
    host_bytes,
    resident_bytes,
    simulate,
)

__all__ = ["MAX_ACT_LEAD", "Plan", "PlanBudgets", "PlanMode", "make_plan", "resident_plan"]


class PlanMode(enum.Enum):
    """How a plan trains the model."""

    OFFLOAD = "offload"  # host masters, CPU optimizer, blocks streamed or kept per the plan
    RESIDENT = "resident"  # everything on the device, the user's optimizer there: plain PyTorch


@dataclass(frozen=True)
class PlanBudgets:
    """Byte budgets (None = unlimited) the plan must respect."""

    device: int | None
    host: int | None
    nvme: int = 0


@dataclass(frozen=True)
class Plan:
    """Per-block decisions, the bytes per tier they need and the predicted step time."""

    blocks: tuple[BlockPlan, ...]
    prefetch_depth: int
    overlap: bool
    device_peak: int
    host_bytes: int
    nvme_bytes: int
    time: StepTime
    mode: PlanMode = PlanMode.OFFLOAD
    resident: ResidentBytes | None = field(default=None, compare=False)  # the resident plan's byte split
    act_lead: int = 1  # blocks ahead that backward fetches swapped activations back

    @property
    def tier(self) -> str:
        """One line saying where the training state lives."""
        if self.mode is PlanMode.RESIDENT:
            return (
                f"resident: everything fits the device, no offload ({format_bytes(self.device_peak)} on the device, "
                "the optimizer steps there)"
            )
        return (
            f"offload: {format_bytes(self.device_peak)} device peak, {format_bytes(self.host_bytes)} host, "
            f"{format_bytes(self.nvme_bytes)} NVMe"
        )

    def counts(self) -> dict[str, int]:
        """How many blocks take each choice."""
        out = {a.value: sum(b.activation is a for b in self.blocks) for a in Action}
        out["resident"] = sum(b.resident for b in self.blocks)
        out["streamed"] = len(self.blocks) - out["resident"]
        out["state_on_nvme"] = sum(b.state_on_nvme for b in self.blocks)
        out["grad_on_device"] = sum(b.grad_on_device for b in self.blocks)
        out["cast_on_device"] = sum(b.cast_on_device for b in self.blocks)
        return out

    def summary(self) -> dict[str, object]:
        """A JSON-ready description (bytes per tier, time split, bottleneck)."""
        t = self.time
        out: dict[str, object] = {"mode": self.mode.value, "tier": self.tier}
        if self.resident is not None:
            out["resident_bytes"] = {**vars(self.resident), "total": self.resident.total}
        return out | {
            "blocks": self.counts(),
            "prefetch_depth": self.prefetch_depth,
            "activation_lead": self.act_lead,
            "overlap_optimizer": self.overlap,
            "bytes": {"device_peak": self.device_peak, "host": self.host_bytes, "nvme": self.nvme_bytes},
            "host_memory": {"traffic_bytes_per_step": t.host_traffic, "bandwidth_bytes_per_s": t.host_bandwidth},
            "predicted_s": {
                "compute": t.compute,
                "h2d": t.h2d,
                "d2h": t.d2h,
                "cpu_optimizer": t.cpu_optimizer,
                "cpu_update": t.cpu_update,
                "cpu_fold": t.cpu_fold,
                "cpu_cast": t.cpu_cast,
                "disk": t.disk,
                "host_memory": t.host_memory,
                "step": t.predicted,
            },
            "bottleneck": t.bottleneck,
        }


# -- the planner ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Problem:
    prof: ModelProfile
    budgets: PlanBudgets
    hw: Hardware
    depth: int
    overlap: bool
    carry: bool = False
    lead: int = 1  # blocks ahead that backward fetches swapped activations back

    def simulate(self, blocks: tuple[BlockPlan, ...]) -> tuple[list[SimEvent], StepTime]:
        return simulate(blocks, self.prof, self.hw, self.depth, self.overlap, self.carry, self.lead)

    def finish(self, blocks: tuple[BlockPlan, ...]) -> Plan:
        events, time = self.simulate(blocks)
        host, nvme = host_bytes(self.prof, blocks)
        peak = max(e.device_bytes for e in events)
        return Plan(blocks, self.depth, self.overlap, peak, host, nvme, time, act_lead=self.lead)

    def accept(self, candidate: list[BlockPlan], best: float) -> float | None:
        """The candidate's simulated step time when it fits and is no slower than ``best``, else None.

        (A ``best`` scaled below the current step asks for a strict gain.)
        """
        cand = tuple(candidate)
        events, time = self.simulate(cand)
        if self.budgets.device is not None and max(e.device_bytes for e in events) > self.budgets.device:
            return None
        if self.budgets.host is not None and host_bytes(self.prof, cand)[0] > self.budgets.host:
            return None
        return time.predicted if time.predicted <= best * (1 + 1e-9) else None

    def step_time(self, blocks: list[BlockPlan]) -> float:
        return self.simulate(tuple(blocks))[1].predicted


def _spill_states(prof: ModelProfile, budgets: PlanBudgets, blocks: list[BlockPlan]) -> None:
    """Move optimizer state of the last blocks (updated first in backward) to NVMe until host fits."""
    host, nvme = host_bytes(prof, tuple(blocks))
    for i in reversed(range(len(blocks))):
        if budgets.host is None or host <= budgets.host:
            break
        blocks[i] = replace(blocks[i], state_on_nvme=True)
        host, nvme = host_bytes(prof, tuple(blocks))
    if budgets.host is not None and host > budgets.host:
        raise CapacityError(
            f"host budget {format_bytes(budgets.host)} is too small: master weights, gradients and the "
            f"resident optimizer state need {format_bytes(host)} even with every block's optimizer state on "
            f"NVMe; raise host_budget to at least {format_bytes(host)} or train a smaller model",
            tier="host",
            needed=host,
            budget=budgets.host,
        )
    if nvme > budgets.nvme:
        raise CapacityError(
            f"host budget {format_bytes(budgets.host or 0)} needs {format_bytes(nvme)} of optimizer state on "
            f"NVMe, NVMe budget is {format_bytes(budgets.nvme)}; set nvme_budget >= {format_bytes(nvme)} "
            f"(with nvme_path) or raise host_budget by that much",
            tier="nvme",
            needed=nvme,
            budget=budgets.nvme,
        )


def resident_plan(prof: ModelProfile, budgets: PlanBudgets, *, required: bool = False) -> Plan | None:
    """The plan that offloads nothing, when the whole training state fits the device budget (else None).

    Its device peak is :func:`~carina.offload.simulator.resident_bytes` (every block's activations
    kept); its predicted step is the compute alone (forward and backward of every micro-batch).

    Raises:
        CapacityError: ``required`` and it does not fit.
    """
    need = resident_bytes(prof)
    if budgets.device is not None and need.total > budgets.device:
        if not required:
            return None
        raise CapacityError(
            f"resident='on' but the whole training state needs {format_bytes(need.total)} on the device "
            f"(parameters, gradients, optimizer state, activations), budget {format_bytes(budgets.device)}; use "
            f"resident='auto' (offload when it does not fit) or a larger device budget",
            tier="device",
            needed=need.total,
            budget=budgets.device,
        )
    fwd = prof.other_fwd_s + sum(b.fwd_s for b in prof.blocks)
    compute = fwd * (1 + prof.bwd_over_fwd) * prof.micro_batches
    time = StepTime(compute=compute, h2d=0.0, d2h=0.0, cpu_optimizer=0.0, disk=0.0, predicted=compute,
                    bottleneck="compute")  # fmt: skip
    blocks = tuple(BlockPlan(resident=True, activation=Action.KEEP, grad_on_device=True) for _ in prof.blocks)
    return Plan(blocks, 0, False, need.total, 0, 0, time, mode=PlanMode.RESIDENT, resident=need)


def make_plan(
    prof: ModelProfile,
    budgets: PlanBudgets,
    hw: Hardware,
    *,
    policy: str = "plan",
    prefetch_depth: int = 1,
    overlap: bool = True,
    cast: str = "host",
    carry: bool = False,
    resident: str = "off",
    act_lead: int = 0,
) -> Plan:
    """Choose residency, activation action, gradient accumulation, cast and optimizer-state tier per block.

    Args:
        prof: The profiled model.
        budgets: Device, host and NVMe budgets.
        hw: Measured rates.
        policy: ``plan`` (choose per block), ``keep``, ``swap`` or ``recompute`` (fixed).
        prefetch_depth: Blocks fetched ahead of use.
        overlap: Whether the CPU optimizer runs during backward.
        cast: Where updated masters are cast into the compute dtype: ``host`` (a host copy, the
            CPU casts), ``device`` (float32 fetched, the device casts) or ``auto`` (per block,
            from the device; a block casts on the host only where that makes the step faster).
        carry: Whether overlapped updates may run on into the next step's forward (``step_barrier``
            off), see :func:`~carina.offload.simulator.simulate`.
        resident: ``auto``: the resident plan (:func:`resident_plan`) whenever everything fits the
            device; ``on``: that plan or CapacityError; ``off``: always an offloaded plan.
        act_lead: Blocks ahead that backward fetches swapped activations back (0: chosen, see below).

    Swapped activations come back ``lead`` blocks ahead of their backward (``act_lead``): 1, and
    where the plan with 1 does not keep every block's activations, deeper leads too, up to
    :data:`MAX_ACT_LEAD` (the link carries a large block's activations in time only when they are
    fetched earlier, at the cost of their device bytes meanwhile); the fastest plan that fits wins.

    Raises:
        CapacityError: No choice fits; the message says what would.
    """
    whole = None if resident == "off" else resident_plan(prof, budgets, required=resident == "on")
    if whole is not None:
        return whole
    args = (prof, budgets, hw, policy, prefetch_depth, overlap, cast, carry)
    best = _offload_plan(*args, lead=act_lead or 1)
    if not act_lead and policy in ("plan", "swap") and any(b.activation is not Action.KEEP for b in best.blocks):
        for lead in range(2, MAX_ACT_LEAD + 1):
            try:
                plan = _offload_plan(*args, lead=lead)
            except CapacityError:
                break
            if plan.time.predicted < best.time.predicted * (1 - 1e-6):
                best = plan
    return best


#: The deepest activation lead :func:`make_plan` tries.
MAX_ACT_LEAD = 3


def _offload_plan(
    prof: ModelProfile,
    budgets: PlanBudgets,
    hw: Hardware,
    policy: str,
    prefetch_depth: int,
    overlap: bool,
    cast: str,
    carry: bool,
    *,
    lead: int,
) -> Plan:
    """The offloaded plan of :func:`make_plan` with swapped activations fetched ``lead`` blocks ahead."""
    problem = _Problem(prof, budgets, hw, prefetch_depth, overlap, carry, lead)
    fixed = None if policy == "plan" else Action(policy)
    start = fixed or Action.RECOMPUTE
    on_device = cast != "host" and prof.copy_bytes_per_param > 0
    blocks = [BlockPlan(activation=start, cast_on_device=on_device) for _ in prof.blocks]
    _spill_states(prof, budgets, blocks)
    floor = problem.finish(tuple(blocks)).device_peak
    if budgets.device is not None and floor > budgets.device:
        raise CapacityError(
            f"device budget {format_bytes(budgets.device)} is too small: streaming every block with "
            f"activations {start.value} and prefetch depth {prefetch_depth} needs {format_bytes(floor)}"
            f"{_head_note(problem, blocks, floor)}; raise the device budget to at least {format_bytes(floor)}, "
            f"lower prefetch_depth or use fewer tokens per micro-batch",
            tier="device",
            needed=floor,
            budget=budgets.device,
            head_workspace=prof.head_workspace_bytes or None,
        )
    orders = [("activations", "grads", "residency")]
    if prof.micro_batches > 1:
        orders.append(("grads", "activations", "residency"))
    orders.append(("residency", "activations", "grads"))  # weights first: fewer bytes over PCIe and host memory
    improve = {"activations": _improve_activations if fixed is None else lambda _p, b: b,
               "grads": _improve_grad_accumulation, "residency": _improve_residency}  # fmt: skip
    plans = []
    for order in orders:
        trial = [*blocks]
        for what in order:
            trial = improve[what](problem, trial)
        if cast == "auto" and on_device:
            trial = _greedy(problem, trial, range(len(trial)), strict=True, cast_on_device=False)
        plans.append(problem.finish(tuple(trial)))
    # device memory goes first where it relieves the bottleneck: the fastest of the orders
    return min(plans, key=lambda plan: plan.time.predicted)


def _head_note(problem: _Problem, blocks: list[BlockPlan], floor: int) -> str:
    """Name the head's transient workspace when the head stage is where the floor peaks."""
    work = problem.prof.head_workspace_bytes
    events, _ = problem.simulate(tuple(blocks))
    if not work or not any(e.kind == "head" and e.device_bytes == floor for e in events):
        return ""
    return (
        f" at the head, of which {format_bytes(work)} is the head workspace (transient logits, their "
        f"float32 upcast and the loss gradients)"
    )


def _greedy(
    problem: _Problem, blocks: list[BlockPlan], order: Iterable[int], *, strict: bool = False, **change: Any
) -> list[BlockPlan]:
    """Try ``change`` on each block in ``order``; keep every trial the problem accepts (fits and is no slower).

    With ``strict`` a trial must make the step faster (for changes that cost host RAM, like a host copy).
    """
    best = problem.step_time(blocks)
    for i in order:
        trial = [*blocks]
        trial[i] = replace(blocks[i], **change)
        got = problem.accept(trial, best * (1 - 1e-6) if strict else best)
        if got is not None:
            blocks, best = trial, got
    return blocks


def _improve_activations(problem: _Problem, blocks: list[BlockPlan]) -> list[BlockPlan]:
    """Greedy: keep where recompute time saved per byte-second held is largest, then swap where it pays.

    Among alike blocks the last ones hold kept bytes the shortest (:meth:`ModelProfile.kept_lifetimes`), leaving the
    memory of the rest of the step to resident weights and swaps in flight (the S2 32k plan kept its
    first two blocks, 6.1 GB each, and had room for neither). Swaps go by recompute time per byte.
    """
    prof, life = problem.prof, problem.prof.kept_lifetimes()
    per_byte = [b.fwd_s / max(1, b.act_bytes) for b in prof.blocks]
    orders = {
        Action.KEEP: sorted(range(len(blocks)), key=lambda i: -per_byte[i] / max(life[i], 1e-9)),
        Action.SWAP: sorted(range(len(blocks)), key=lambda i: -per_byte[i]),
    }
    for action, order in orders.items():
        recomputed = [i for i in order if blocks[i].activation is Action.RECOMPUTE]
        blocks = _greedy(problem, blocks, recomputed, activation=action)
    return blocks


def _improve_grad_accumulation(problem: _Problem, blocks: list[BlockPlan]) -> list[BlockPlan]:
    """Greedy: with several micro-batches, accumulate gradients on the device where memory allows.

    A block that accumulates on the device holds a float32 gradient buffer (4 bytes per
    parameter) for the whole step; in exchange its micro-batches send nothing to the host
    and the CPU worker never adds them, only the final float32 sum crosses PCIe. Blocks
    are tried from the last (first in backward), whose host staging is reused soonest.
    """
    if problem.prof.micro_batches < 2:
        return blocks
    return _greedy(problem, blocks, reversed(range(len(blocks))), grad_on_device=True)


def _improve_residency(problem: _Problem, blocks: list[BlockPlan]) -> list[BlockPlan]:
    """Greedy: with the device memory left, keep blocks' parameters resident (no PCIe traffic)."""
    return _greedy(problem, blocks, range(len(blocks)), resident=True)
