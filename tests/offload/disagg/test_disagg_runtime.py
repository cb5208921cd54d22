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
from carina.offload.disagg.config import WorkerRuntime
from carina.offload.disagg.demo import lm_loss, synthetic_batch, tiny_llama
from carina.offload.disagg.job import _init_segment
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


def test_block_runtime_worker_streams_and_is_bitwise_in_process(tmp_path):
    """One worker (this thread) on the block runtime, two PS shards (threads) over one segment."""
    cfg = _cfg(1, 2)
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
