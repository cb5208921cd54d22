"""Workers on carina.offload's block runtime: the PS is the runtime's gradient/optimizer backend."""

from __future__ import annotations

import functools
import os
import threading

import pytest
import torch
from disagg_reference import reference

import carina.offload as co
from carina.errors import ConfigError
from carina.offload.disagg import DisaggConfig, launch
from carina.offload.disagg.backend import offload_worker
from carina.offload.disagg.config import PSKernel, WorkerRuntime
from carina.offload.disagg.demo import lm_loss, synthetic_batch, tiny_llama
from carina.offload.disagg.job import _init_segment
from carina.offload.disagg.layout import publish_order
from carina.offload.disagg.server import ShardServer
from carina.offload.disagg.worker import PSLink

STEPS = 4
# A 4-layer demo Llama: blocks of ~164 KiB and ~131 KiB of the rest (~790 KiB of fp32 parameters);
# this budget is under twice the parameters, so blocks must stream (as in tests/offload/test_bitwise.py).
TIGHT = 1_300_000
MODEL = functools.partial(tiny_llama, layers=4)


def _cfg(workers: int, shards: int, **kw) -> DisaggConfig:
    offload = co.OffloadConfig(device="cpu", device_budget=TIGHT)
    return DisaggConfig(
        workers=workers,
        ps_shards=shards,
        device="cpu",
        lr=1e-2,
        weight_decay=0.1,
        offload=offload,
        step_timeout_s=60,
        **kw,
    )


@pytest.mark.parametrize("kernel", [PSKernel.SINGLE, PSKernel.FUSED])
def test_block_runtime_worker_streams_and_is_bitwise_in_process(tmp_path, kernel):
    """One worker (this thread) on the block runtime, two PS shards (threads) over one segment."""
    cfg = _cfg(1, 2, ps_kernel=kernel)
    layout, segment, control = _init_segment(cfg, tmp_path, MODEL(), None)
    servers = [ShardServer(cfg, s, layout, segment, control) for s in range(2)]
    threads = [threading.Thread(target=s.run, args=(STEPS, [os.getpid()])) for s in servers]
    for t in threads:
        t.start()
    losses = []
    try:
        model, opt = offload_worker(MODEL(), cfg, PSLink(cfg, 0, layout, segment, control), "cpu")
        for k in range(STEPS):
            loss = lm_loss(model, synthetic_batch(k, 0, 1))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    except BaseException:
        control.abort(0)  # release the shard threads
        raise
    for t in threads:
        t.join(60)
    handle = co.handle_of(model)
    assert handle.optimizer is opt and handle.runtime.step_group == opt.step_group
    assert handle.plan is not None and handle.plan.counts()["streamed"] > 0  # blocks really streamed
    assert handle.stats().peak["device"] <= TIGHT
    assert min(control.done_step(s) for s in range(2)) == STEPS
    ref_losses, ref_params = reference(1, STEPS, cfg, layers=4)
    assert losses == ref_losses
    for server in servers:
        for slot, master in zip(server.slots, server.masters, strict=True):
            assert torch.equal(master.detach(), ref_params[slot.name]), slot.name
    handle.close()


def test_publish_order_puts_the_rest_first_then_blocks_in_order():
    names = ["model.embed.weight", "model.layers.1.w", "model.layers.0.w", "model.layers.10.w", "lm_head.weight"]
    assert [names[i] for i in publish_order(names)] == [
        "model.embed.weight",
        "lm_head.weight",
        "model.layers.0.w",
        "model.layers.1.w",
        "model.layers.10.w",
    ]


def test_pulls_overlap_the_next_forward_in_publish_order(tmp_path):
    """After a planned step, each group's pull is its pending update, and shards publish in forward order."""
    cfg = _cfg(1, 1)
    layout, segment, control = _init_segment(cfg, tmp_path, MODEL(), None)
    seen: list[tuple[int, int]] = []
    record = control.set_published
    control.set_published = lambda i, step: (seen.append((i, step)), record(i, step))[1]  # type: ignore[method-assign]
    server = ShardServer(cfg, 0, layout, segment, control)
    thread = threading.Thread(target=server.run, args=(STEPS, [os.getpid()]))
    thread.start()
    try:
        model, opt = offload_worker(MODEL(), cfg, PSLink(cfg, 0, layout, segment, control), "cpu")
        rt = co.handle_of(model).runtime
        queued, losses = [], []
        for k in range(STEPS):
            loss = lm_loss(model, synthetic_batch(k, 0, 1))
            loss.backward()
            opt.step()
            queued.append([len(g.updates) for g in rt.groups])
            losses.append(float(loss.detach()))
        opt.finish()
    except BaseException:
        control.abort(0)
        raise
    thread.join(60)
    planned = cfg.offload.profile_steps
    assert queued[:planned] == [[0] * len(rt.groups)] * planned  # profiling steps pull at once
    assert all(q == [1] * len(rt.groups) for q in queued[planned:])  # then one queued pull per group
    assert all(len(g.updates) == 0 for g in rt.groups)  # finish() waited for the last ones
    names = [s.name for s in layout.slots]
    for k in range(STEPS):
        assert [i for i, step in seen if step == k + 1] == publish_order(names)
    ref_losses, ref_params = reference(1, STEPS, cfg, layers=4)
    assert losses == ref_losses  # the overlapped pulls change no bit
    assert all(torch.equal(m.detach(), ref_params[s.name]) for s, m in zip(server.slots, server.masters, strict=True))
    co.handle_of(model).close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "shards", "runtime"),
    [(1, 1, WorkerRuntime.OFFLOAD), (2, 2, WorkerRuntime.OFFLOAD)],  # plain workers: test_disagg.py
)
def test_worker_processes_bitwise_equal_to_single_process(workers, shards, runtime):
    cfg = _cfg(workers, shards, runtime=runtime)
    result = launch(cfg, steps=STEPS, model_fn=MODEL)
    ref_losses, ref_params = reference(workers, STEPS, cfg, layers=4)
    assert result.steps_done == STEPS
    assert result.losses == ref_losses
    for name, value in ref_params.items():
        assert torch.equal(result.masters[name], value), name


def test_runtime_config_refuses_what_the_ps_cannot_do():
    with pytest.raises(ConfigError) as info:
        DisaggConfig(offload=co.OffloadConfig(max_grad_norm=1.0))
    assert info.value.context["key"] == "offload.max_grad_norm"
    with pytest.raises(ConfigError):
        DisaggConfig(offload=co.OffloadConfig(grad_accumulation=2))
    cfg = DisaggConfig(runtime="plain", ps_threads=4)
    assert DisaggConfig.from_toml(cfg.to_toml()) == cfg
