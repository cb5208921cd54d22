"""The step timer (``Config(step_timing=True)``) and the CPU optimizer worker's thread team."""

from __future__ import annotations

import pytest
import torch
from offload_fixtures import tiny_llama, train_losses

import carina.offload as co
from carina.core.errors import ConfigError
from carina.offload.profiler import _optimizer_rate
from carina.offload.timing import PHASES, StepTimer, summarize


def _run(steps: int = 4, **cfg_kwargs):
    model = tiny_llama()
    cfg = co.Config(device="cpu", device_budget=2_100_000, **cfg_kwargs)
    model, opt = co.wrap(model, cfg, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = train_losses(model, opt, steps)
    handle = co.handle_of(model)
    return losses, handle


@pytest.mark.parametrize("policy", ["keep", "swap", "recompute"])
def test_phases_partition_each_step_and_count_every_update(policy):
    _, handle = _run(activations=policy, step_timing=True)
    steps = handle.step_times()
    assert len(steps) == 4  # profiling steps included: one split per optimizer step
    numel = sum(g.numel for g in handle.runtime.groups)
    for split in steps:
        assert set(split) >= {f"{p}_s" for p in PHASES} | {"device_s", "wall_s", "optim_update_s", "optim_params"}
        assert all(split[f"{p}_s"] >= 0 for p in PHASES)
        assert split["device_s"] == sum(split[f"{p}_s"] for p in PHASES)
        assert split["optim_params"] == numel  # every block and the rest updated exactly once per step
        assert split["forward_s"] > 0 and split["backward_s"] > 0 and split["h2d_wait_s"] > 0
    planned = steps[-1]  # under the plan the policy is in force everywhere
    assert (planned["recompute_s"] > 0) == (policy == "recompute")
    assert (planned["act_wait_s"] > 0) == (planned["act_offload_s"] > 0) == (policy == "swap")
    handle.close()


def test_timing_changes_no_result_and_is_off_by_default():
    timed, handle = _run(step_timing=True)
    handle.close()
    plain, handle = _run()
    assert timed == plain  # bitwise: timing only reads clocks
    assert handle.runtime.timer is None and handle.step_times() == []
    handle.close()


def test_summarize_takes_medians_over_steps():
    assert summarize([{"a_s": 1.0, "n": 4}, {"a_s": 3.0, "n": 4}, {"a_s": 2.0}]) == {"a_s": 2.0, "n": 4}


def test_a_step_timer_without_a_step_records_nothing():
    timer = StepTimer(torch.device("cpu"))
    timer.switch("forward")
    with timer.phase("h2d_wait"):
        pass
    assert timer.end_step() is None and timer.steps == []
    timer.begin()
    with timer.phase("h2d_wait"):
        timer.switch("act_wait")  # an inner switch ends with its phase
    timer.switch("forward")
    split = timer.end_step()
    assert split is not None and not timer.running
    assert split["device_s"] == sum(split[f"{p}_s"] for p in PHASES)


def test_worker_team_size_is_its_own_and_the_callers_is_kept():
    before = torch.get_num_threads()
    _, handle = _run(steps=1, cpu_optimizer_threads=1)
    rt = handle.runtime
    assert rt.optim_threads == 1
    assert rt.worker.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == before
    handle.close()
    _, handle = _run(steps=1)  # auto with a CPU device: PyTorch's own count (the compute shares the cores)
    assert handle.runtime.optim_threads == before
    handle.close()


def test_optimizer_probe_restores_the_callers_team():
    before = torch.get_num_threads()
    user = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3, fused=True)
    assert _optimizer_rate(user, 1 << 12, threads=1) > 0
    assert torch.get_num_threads() == before


def test_optimizer_threads_are_validated():
    with pytest.raises(ConfigError) as err:
        co.Config(cpu_optimizer_threads=-1)
    assert err.value.context["key"] == "cpu_optimizer_threads"
    assert co.Config.from_dict(co.Config(cpu_optimizer_threads=3, step_timing=True).to_dict()).step_timing
