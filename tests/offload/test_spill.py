"""The spill pipeline: optimizer state on NVMe read ahead and written back beside the updates (CPU).

The overlap is proven with gates, not clocks: a gate holds an IO request, or a block's backward, until
the pipeline's event log shows that what a serial pipeline would do first has not happened yet. A
pipeline that waited where it must not would never open the gate; each gate gives up after ``WAIT``
seconds and records a violation, which fails the test.
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import threading
import time
from collections.abc import Callable

import pytest
import torch
from offload_fixtures import tiny_llama, token_batches

import carina.offload as co
from carina.core.errors import IOEngineError
from carina.io._future import Op, OpKind
from carina.testing.io import MockBackend

STEPS = 12
WAIT = 30.0


def _exact_budget(model: torch.nn.Module, accum: int) -> int:
    """A host budget the plan fills to the byte: 3 of 4 blocks' state on NVMe, one block's state in the slot.

    Float32 masters and gradients (8 bytes per parameter; 4 more of staging with micro-batches added on the
    host), the rest's AdamW state (8), one block's state in RAM and one spilled block's (2 x 8 per block
    parameter), AdamW's step counts (4 per tensor).
    """
    numel = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.model.layers[0].parameters())
    rest = numel - len(model.model.layers) * block
    per_param = 8 + (4 if accum > 1 else 0)
    return per_param * numel + 8 * rest + 2 * 8 * block + 4 * sum(1 for _ in model.parameters())


def _wrapped(tmp_path, **cfg_kwargs):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    budget = _exact_budget(model, cfg_kwargs.get("grad_accumulation", 1))
    cfg = co.Config(device="cpu", device_budget=1_300_000, host_budget=budget, nvme_path=tmp_path,
                    nvme_budget=8 << 20, activations="recompute", **cfg_kwargs)  # fmt: skip
    model, opt = co.wrap(model, cfg, optimizer=opt)
    opt.spill_pipe.log = []
    return model, opt, cfg


def _loop(model, opt, steps, *, accum=1, scheduler=None, before=None, first=0):
    """The user's loop (as ``offload_fixtures.train_losses``) from step ``first`` on, a hook before each step."""
    losses = []
    batches = token_batches((first + steps) * accum)[first * accum :]
    for k, ids in enumerate(batches):
        if before is not None and k % accum == 0:
            before(first + k // accum)
        out = model(input_ids=ids, labels=ids)
        (out.loss / accum).backward()
        losses.append(out.loss.item())
        if (k + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
            if scheduler is not None:
                scheduler.step()
    return losses


def _plain(steps, *, accum=1, clip=None, sched=False):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5) if sched else None
    losses = []
    for k, ids in enumerate(token_batches(steps * accum)):
        out = model(input_ids=ids, labels=ids)
        (out.loss / accum).backward()
        losses.append(out.loss.item())
        if (k + 1) % accum == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            if scheduler is not None:
                scheduler.step()
    return losses, model.state_dict(), opt.state_dict()


def _assert_same_state(ours: dict, theirs: dict) -> None:
    assert ours["state"].keys() == theirs["state"].keys()
    for k, state in theirs["state"].items():
        assert ours["state"][k].keys() == state.keys()
        for name, value in state.items():
            assert torch.equal(ours["state"][k][name], value), (k, name)


def _engine(monkeypatch, script: Callable[[Op], object]) -> None:
    """The NVMe tier's IO engine runs on the scripted mock backend (real IO, faults and holds by script)."""
    import carina.io as cio

    real = cio.IOEngine
    monkeypatch.setattr(cio, "IOEngine", lambda config=None: real(config, backend=MockBackend(script=script)))


def _wait_for(condition: Callable[[], bool], violations: list[str], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            violations.append(what)
            return
        time.sleep(0.001)


@pytest.mark.parametrize(
    ("accum", "clip", "sched"),
    [(1, None, False), (2, 0.5, True)],  # updates during backward; at step(), after clipping, accumulated
)
def test_twelve_steps_with_the_spill_pipeline_are_bitwise_plain_pytorch(tmp_path, accum, clip, sched):
    ref_losses, ref_model, ref_opt = _plain(STEPS, accum=accum, clip=clip, sched=sched)
    model, opt, cfg = _wrapped(tmp_path, grad_accumulation=accum, max_grad_norm=clip)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5) if sched else None
    assert _loop(model, opt, STEPS, accum=accum, scheduler=scheduler) == ref_losses
    state = model.state_dict()
    assert all(torch.equal(state[name], value) for name, value in ref_model.items())
    _assert_same_state(opt.state_dict(), ref_opt)  # the spilled blocks' AdamW moments too, read from NVMe
    handle = co.handle_of(model)
    assert handle.plan.counts()["state_on_nvme"] == 3
    log = opt.spill_pipe.log
    ahead = [b for e, b, d in log if e == "read" and d == 1]
    assert len(ahead) >= STEPS - 2, "not every planned step's first spilled state was read ahead"
    # the ledger never held a second spilled block's state: the plan fills the budget to the byte (one block's
    # state in the slot), so a read charged before the last block's writes were given back would have raised
    assert handle.stats().peak["host"] == handle.plan.host_bytes == cfg.host_budget
    handle.store.close()
    assert not list(tmp_path.iterdir())


def test_a_blocks_writes_run_beside_the_update_of_its_later_tensors(tmp_path, monkeypatch):
    """Every write of a block is held until its last tensor's update has begun: a serial write-back never gets there."""
    violations: list[str] = []
    log: list[tuple[str, int, int]] = []
    last = {}

    def script(op: Op) -> None:
        if op.kind is OpKind.WRITE:
            block = next(b for e, b, _ in reversed(log) if e == "write")
            _wait_for(lambda: ("update", block, last[block]) in log, violations, f"write of block {block}")

    _engine(monkeypatch, script)
    ref_losses, ref_model, _ = _plain(6)
    model, opt, _ = _wrapped(tmp_path)
    opt.spill_pipe.log = log
    for g in co.handle_of(model).runtime.blocks:  # the pipeline updates the largest tensor last
        last[g.index] = max(range(len(g.masters)), key=lambda k: (g.masters[k].numel(), k))
    assert _loop(model, opt, 6) == ref_losses
    assert not violations
    assert all(torch.equal(model.state_dict()[n], v) for n, v in ref_model.items())
    writes = [e for e in log if e[0] == "write"]
    assert len(writes) == 6 * 3 * 9  # every tensor of each of 3 spilled blocks, every step


def test_state_is_read_before_the_backward_that_makes_its_gradient(tmp_path):
    """From the second planned step on, a spilled block's backward waits until its state's read was started.

    A pipeline that reads a block's state only when its update asks for it (after its gradients, so after
    this backward) never starts the read: the gate gives up and records a violation.
    """
    violations: list[str] = []
    model, opt, _ = _wrapped(tmp_path)
    log = opt.spill_pipe.log
    step = {"k": 0}

    def gate(i: int) -> Callable[..., None]:
        def hook(module, grad_output) -> None:
            if step["k"] >= 3:  # steps 0-1 profile, step 2 is the first planned one: it learns the order
                mark = max(j for j, e in enumerate(log) if e[0] == "step")
                _wait_for(lambda: ("read", i, 1) in log[mark:], violations, f"step {step['k']} block {i}")

        return hook

    spilled = sorted(opt.spill)
    for i in spilled:
        model.model.layers[i].register_full_backward_pre_hook(gate(i))

    def before(k: int) -> None:
        step["k"] = k
        log.append(("step", k, -1))

    ref_losses, ref_model, _ = _plain(8)
    assert _loop(model, opt, 8, before=before) == ref_losses
    assert not violations
    assert all(torch.equal(model.state_dict()[n], v) for n, v in ref_model.items())
    mark = next(j for j, e in enumerate(log) if e == ("step", 3, -1))
    reads = [(b, d) for e, b, d in log[mark:] if e == "read"]
    assert sorted(reads) == sorted((i, 1) for i in spilled for _ in range(5))  # every read ahead, none twice
    assert not [e for e in log[mark:] if e[0] == "discard"]


def test_a_failed_read_ahead_raises_and_leaves_its_block_as_it_was(tmp_path, monkeypatch):
    fail = threading.Event()

    def script(op: Op) -> OSError | None:
        if op.kind is OpKind.READ and fail.is_set():
            fail.clear()  # the next read only: the read ahead of this step's first spilled block
            return OSError(errno.EIO, os.strerror(errno.EIO))
        return None

    _engine(monkeypatch, script)
    model, opt, _ = _wrapped(tmp_path)
    _loop(model, opt, 4)
    opt.synchronize()
    pipe, groups = opt.spill_pipe, co.handle_of(model).runtime.groups
    masters = {g.index: g.master.clone() for g in groups}
    state = [(id(mp), name, t) for mp, name, t in pipe.read_out()]
    mark = len(pipe.log)
    fail.set()
    with pytest.raises(IOEngineError) as err:
        _loop(model, opt, 1, first=4)
    # the read that failed: the read ahead of the last block, which backward updates first (were the
    # pipeline's thread not to run before the worker took a block, the read that block's update asked for)
    first = next(b for e, b, _ in pipe.log[mark:] if e == "read")
    name = groups[first].name
    assert err.value.context["block"] == name and "was not updated" in str(err.value)
    for g in groups:
        cf.wait(g.pending)  # the other updates of the step ran on
    pipe.settle()
    assert torch.equal(groups[first].master, masters[first])  # not half updated: not updated at all
    assert all(not torch.equal(g.master, masters[g.index]) for g in groups if g.index != first)
    again = {(id(mp), n): t for mp, n, t in pipe.read_out()}
    mine = {id(mp) for mp in groups[first].masters}
    assert all(torch.equal(again[(m, n)], t) for m, n, t in state if m in mine)  # its state on NVMe too
    assert all(not torch.equal(again[(m, n)], t) for m, n, t in state if m not in mine)
    _loop(model, opt, 1, first=5)  # the disk works again: training goes on
    assert opt.state_dict()["state"]


def test_the_worker_takes_the_block_read_ahead_first_and_no_read_is_thrown_away(tmp_path):
    """Every spilled block's gradients wait on a busy worker: by index it would take the lowest, whose state
    is not the one read ahead. It takes the block whose state is in the slot, then the rest by index."""
    model, opt, _ = _wrapped(tmp_path)
    _loop(model, opt, 4)
    opt.synchronize()
    pipe, worker = opt.spill_pipe, co.handle_of(model).runtime.worker
    spilled = sorted(opt.spill)
    mark = len(pipe.log)
    hold = threading.Event()
    worker.submit(hold.wait, priority=-10)  # the worker is busy until every block's gradients are queued
    ids = token_batches(5)[4]
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    violations: list[str] = []
    _wait_for(lambda: ("read", spilled[-1], 1) in pipe.log[mark:], violations, "read ahead")
    hold.set()
    opt.step()
    opt.zero_grad()
    opt.synchronize()
    assert not violations
    events = pipe.log[mark:]
    assert [b for e, b, _ in events if e == "acquire"] == [spilled[-1], *spilled[:-1]]
    assert not [e for e in events if e[0] == "discard"] and pipe.discarded_bytes == 0
    assert sorted(b for e, b, _ in events if e == "read") == spilled  # each block's state read once


def test_a_failed_write_keeps_the_state_and_training_resumes_bitwise(tmp_path, monkeypatch):
    """The last spilled write-back fails: ``step()`` says so, the state stays in RAM, training resumes exactly."""
    fail = threading.Event()
    log: list[tuple[str, int, int]] = []

    def script(op: Op) -> OSError | None:
        writing = next((b for e, b, _ in reversed(log) if e == "write"), None)
        if op.kind is OpKind.WRITE and fail.is_set() and writing == max(opt.spill):
            fail.clear()
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return None

    _engine(monkeypatch, script)
    ref_losses, ref_model, ref_opt = _plain(8)
    model, opt, cfg = _wrapped(tmp_path, overlap="step")  # at step(), by index: the last block's is the last
    opt.spill_pipe.log = log
    losses = _loop(model, opt, 3)
    fail.set()
    ids = token_batches(4)[3]
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    losses.append(out.loss.item())
    with pytest.raises(IOEngineError) as err:
        opt.step()
    opt.zero_grad()
    assert err.value.context["block"] == co.handle_of(model).runtime.groups[max(opt.spill)].name
    assert "stays in host RAM" in str(err.value)
    assert co.handle_of(model).stats().peak["host"] <= cfg.host_budget
    sd = opt.state_dict()  # complete: the failed block's state from RAM, the others' from NVMe
    opt.load_state_dict(sd)
    assert opt.spill_pipe.error is None
    losses += _loop(model, opt, 4, first=4)
    assert losses == ref_losses
    assert all(torch.equal(model.state_dict()[n], v) for n, v in ref_model.items())
    _assert_same_state(opt.state_dict(), ref_opt)


def test_the_step_timer_reports_the_disk_s_time_and_the_updates_wait_for_it(tmp_path):
    model, opt, _ = _wrapped(tmp_path, step_timing=True)
    _loop(model, opt, 4)
    handle = co.handle_of(model)
    numel = sum(p.numel() for p in model.parameters())
    splits = handle.step_times()[-2:]  # planned steps
    assert all(s["optim_params"] == numel for s in splits)  # every parameter updated once a step
    assert all(s["optim_disk_s"] > 0 and s["optim_disk_wait_s"] >= 0 for s in splits)
