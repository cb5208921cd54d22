"""Start one host's PS shards and workers, train, and collect the outcome.

The parent builds the model once to lay out the shared segment and write the initial fp32
masters, spawns the workers and then the PS shards (which watch the workers' pids), and
waits. Each of the ``hosts · workers`` workers computes ``loss / (hosts · workers)`` on its
slice of the global batch, so the PS's plain sum (across hosts: an all-reduce of the shard sums)
equals the gradient of the mean loss over the global batch.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carina.core.errors import CarinaError, ConfigError
from carina.offload.disagg.config import DisaggConfig, WorkerRuntime
from carina.offload.disagg.control import Control, WorkerDied
from carina.offload.disagg.demo import lm_loss, synthetic_batch, tiny_llama
from carina.offload.disagg.layout import SharedLayout, map_segment, view
from carina.offload.disagg.server import publish_dtype, serve_shard
from carina.offload.disagg.state import load_ps_state, ps_state

__all__ = ["LaunchResult", "launch"]


@dataclass
class LaunchResult:
    """What a job produced: the global loss per step, the final fp32 masters, worker 0's step times."""

    losses: list[float]
    masters: dict[str, Any]
    steps_done: int
    step_seconds: list[float] = field(default_factory=list)


def _worker_main(
    cfg: DisaggConfig,
    rank: int,
    layout: SharedLayout,
    job: str,
    steps: tuple[int, int],
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int, int, int], Any],
    loss_fn: Callable[[Any, Any], Any],
) -> None:
    import torch

    from carina.offload.disagg.worker import DisaggWorker, PSLink

    torch.set_num_threads(cfg.worker_threads)
    device = _device(cfg)
    segment = map_segment(Path(job) / "segment", layout.nbytes, create=False)
    control = Control(Path(job) / "control", cfg.workers, cfg.ps_shards, create=False, slots=len(layout.slots))
    model = model_fn()
    step: Callable[[], None]
    finish: Callable[[], None] = _nothing
    if cfg.runtime is WorkerRuntime.OFFLOAD:
        from carina.offload.disagg.backend import offload_worker

        model, backend = offload_worker(model, cfg, PSLink(cfg, rank, layout, segment, control), device)
        step, finish = backend.step, backend.finish
    else:
        model = model.to(device)
        step = DisaggWorker(model, cfg, rank, layout, segment, control, device=device).step
    losses, seconds = [], []
    world = cfg.hosts * cfg.workers  # every worker of every host takes one slice of the global batch
    for k in range(*steps):
        t0 = time.perf_counter()
        batch = batch_fn(k, cfg.host_rank * cfg.workers + rank, world).to(device)
        loss = loss_fn(model, batch) / world
        loss.backward()
        step()
        losses.append(float(loss.detach()))  # waits for the device: the step is over
        seconds.append(time.perf_counter() - t0)
    finish()  # the last update is in this worker's host copies (it overlapped nothing)
    (Path(job) / f"losses{rank}.json").write_text(json.dumps({"losses": losses, "seconds": seconds}))


def _nothing() -> None:
    """A plain worker's step leaves nothing pending."""


def _device(cfg: DisaggConfig) -> str:
    if cfg.device != "auto":
        return cfg.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _init_segment(
    cfg: DisaggConfig, job: Path, model: Any, state: Mapping[str, Any] | None
) -> tuple[SharedLayout, Any, Control]:
    import torch

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [(n, tuple(p.shape)) for n, p in trainable]
    itemsize = torch.empty(0, dtype=publish_dtype(cfg)).element_size()
    moments = 2 if cfg.optimizer == "adamw" else 0
    layout = SharedLayout.plan(
        params, workers=cfg.workers, shards=cfg.ps_shards, publish_itemsize=itemsize, moments=moments
    )
    layout.check_fits(job)
    segment = map_segment(job / "segment", layout.nbytes, create=True)
    control = Control(job / "control", cfg.workers, cfg.ps_shards, create=True, slots=len(layout.slots))
    if state is not None:
        load_ps_state(layout, segment, state, publish_dtype(cfg))
        return layout, segment, control
    with torch.no_grad():
        for slot, (_, p) in zip(layout.slots, trainable, strict=True):
            view(segment, slot.master, slot.shape, torch.float32).copy_(p.detach().float())
            view(segment, slot.published, slot.shape, publish_dtype(cfg)).copy_(p.detach())
    return layout, segment, control


def launch(
    cfg: DisaggConfig,
    *,
    steps: int,
    model_fn: Callable[[], Any] = tiny_llama,
    batch_fn: Callable[[int, int, int], Any] = synthetic_batch,
    loss_fn: Callable[[Any, Any], Any] = lm_loss,
    start_step: int = 0,
    state: Mapping[str, Any] | None = None,
    on_checkpoint: Callable[[int, dict[str, Any]], None] | None = None,
) -> LaunchResult:
    """Train global steps ``start_step .. steps-1`` with ``cfg.workers`` workers and ``cfg.ps_shards`` shards.

    Args:
        cfg: Workers, shards, runtime, optimizer.
        steps: The global step to stop at.
        model_fn: Builds the model (identically in every process).
        batch_fn: ``(step, global_rank, global_workers)`` -> that worker's slice of the batch.
        loss_fn: ``(model, batch)`` -> loss.
        start_step: The first global step (after a restore; batches are drawn by global step).
        state: PS state to start from (a tree from :func:`~carina.offload.disagg.state.ps_state`),
            else the masters come from ``model_fn()`` and the optimizer state is fresh.
        on_checkpoint: Called as ``(step, ps_state)`` while the shards hold at every multiple of
            ``cfg.checkpoint_every`` after ``start_step`` (the last step included); the tree
            holds views of shared memory, so copy what you keep before returning.

    Raises:
        WorkerDied: A worker died; the error names it and the masters stay at the last full step.
        CapacityError: The shared segment does not fit ``cfg.shm_dir`` (before anything starts).
        ConfigError: ``cfg.shm_dir`` is not a directory, or ``start_step`` is not below ``steps``.
    """
    import torch.multiprocessing as mp

    if not 0 <= start_step < steps:
        raise ConfigError(f"start_step {start_step} must be in [0, {steps})", key="start_step")
    # A fork server that has imported torch and transformers once (and never touched CUDA):
    # each process then starts in milliseconds instead of re-importing everything.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "carina.offload.disagg.job",
            "carina.offload.disagg.worker",
            "carina.offload.disagg.backend",
            "transformers.models.llama.modeling_llama",
        ]
    )
    if not cfg.shm_dir.is_dir():
        raise ConfigError("shm_dir is not a directory", key="shm_dir", path=str(cfg.shm_dir))
    job = Path(tempfile.mkdtemp(prefix="carina-disagg-", dir=cfg.shm_dir))
    try:
        shared = _init_segment(cfg, job, model_fn(), state)
        layout = shared[0]
        workers = [
            ctx.Process(
                target=_worker_main,
                args=(cfg, r, layout, str(job), (start_step, steps), model_fn, batch_fn, loss_fn),
                name=f"carina-worker-{r}",
            )
            for r in range(cfg.workers)
        ]
        for w in workers:
            w.start()
        pids = [w.pid or 0 for w in workers]
        servers = [
            ctx.Process(
                target=serve_shard,
                args=(cfg, s, layout, str(job / "segment"), str(job / "control"), steps - start_step, pids, start_step),
                name=f"carina-ps-{s}",
            )
            for s in range(cfg.ps_shards)
        ]
        for s in servers:
            s.start()
        _supervise(cfg, shared, [*workers, *servers], (start_step, steps), on_checkpoint)
        result = _outcome(cfg, job, (start_step, steps), shared, workers, servers)
        if on_checkpoint is not None and cfg.checkpoint_every and steps % cfg.checkpoint_every == 0:
            on_checkpoint(steps, ps_state(layout, shared[1]))
        return result
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _supervise(
    cfg: DisaggConfig,
    shared: tuple[SharedLayout, Any, Control],
    procs: list[Any],
    span: tuple[int, int],
    on_checkpoint: Callable[[int, dict[str, Any]], None] | None,
) -> None:
    """Wait for every process; at each checkpoint step hand the held PS state to ``on_checkpoint``."""
    layout, segment, control = shared
    start, stop = span
    every = cfg.checkpoint_every
    due = [(start // every + 1) * every if every else stop]

    def take_due() -> bool:
        # Shards hold before applying step `due`, so all of them are exactly there: a consistent state.
        if due[0] < stop and start + min(control.done_step(s) for s in range(cfg.ps_shards)) >= due[0]:
            if on_checkpoint is not None:
                on_checkpoint(due[0], ps_state(layout, segment))
            control.set_taken(due[0])
            due[0] += every
            return True
        return False

    try:
        while any(p.is_alive() for p in procs):
            if not take_due():
                time.sleep(0.002)
        while take_due():  # a step reached just before everything stopped (a worker died) is still saved
            pass
    except BaseException:
        for p in procs:  # the callback failed (or we were interrupted): stop this job's processes
            if p.is_alive():
                p.kill()
        raise
    finally:
        for p in procs:
            p.join()


def _outcome(
    cfg: DisaggConfig,
    job: Path,
    span: tuple[int, int],
    shared: tuple[SharedLayout, Any, Control],
    workers: list[Any],
    servers: list[Any],
) -> LaunchResult:
    """The finished job's result, or the error naming what died (masters stay at the last full step)."""
    import torch

    layout, segment, control = shared
    start, stop = span
    done = start + min(control.done_step(s) for s in range(cfg.ps_shards))
    masters = {slot.name: view(segment, slot.master, slot.shape, torch.float32).clone() for slot in layout.slots}
    if control.aborted or any(p.exitcode for p in workers):
        dead = control.dead_worker
        if dead is None:
            dead = next(i for i, p in enumerate(workers) if p.exitcode)
        raise WorkerDied(f"worker {dead} died; parameter server state kept at step {done}", worker=dead, step=done)
    if any(p.exitcode for p in servers):
        raise CarinaError("a parameter-server shard failed", exitcodes=[p.exitcode for p in servers])
    per_worker = [json.loads((job / f"losses{r}.json").read_text()) for r in range(cfg.workers)]
    losses = [sum(ws["losses"][k] for ws in per_worker) for k in range(stop - start)]
    return LaunchResult(losses=losses, masters=masters, steps_done=done, step_seconds=per_worker[0]["seconds"])
