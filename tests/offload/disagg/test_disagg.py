import itertools
from pathlib import Path

import pytest
import torch
from disagg_reference import reference

from carina.errors import CapacityError, ConfigError
from carina.offload.disagg import DisaggConfig, launch
from carina.offload.disagg.control import WorkerDied
from carina.offload.disagg.demo import lm_loss, synthetic_batch
from carina.offload.disagg.layout import SharedLayout, assign_shards
from carina.offload.disagg.server import make_optimizer
from carina.testing.disagg import DIE_AT_STEP, DYING_WORKER, dying_batch, frozen_embedding_llama

STEPS = 3


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "shards"), [(1, 1), (2, 2), (4, 3)])
def test_bitwise_equal_to_single_process(workers, shards):
    cfg = DisaggConfig(workers=workers, ps_shards=shards, device="cpu", lr=1e-2, weight_decay=0.1)
    result = launch(cfg, steps=STEPS)
    ref_losses, ref_params = reference(workers, STEPS, cfg)
    assert result.steps_done == STEPS
    assert result.losses == ref_losses
    for name, value in ref_params.items():
        assert torch.equal(result.masters[name], value), name


@pytest.mark.slow
def test_dead_worker_is_named_and_state_stays_at_last_full_step():
    cfg = DisaggConfig(workers=2, ps_shards=2, device="cpu", lr=1e-2, step_timeout_s=60)
    with pytest.raises(WorkerDied) as info:
        launch(cfg, steps=4, batch_fn=dying_batch)
    assert info.value.context["worker"] == DYING_WORKER
    assert info.value.context["step"] == DIE_AT_STEP
    assert f"worker {DYING_WORKER} died" in str(info.value)


def test_shard_assignment_balances_and_is_deterministic():
    sizes = [100, 1, 50, 50, 3, 97]
    owners = assign_shards(sizes, 2)
    load = [sum(s for s, o in zip(sizes, owners, strict=True) if o == k) for k in range(2)]
    assert sorted(load) == [150, 151]
    assert owners == assign_shards(sizes, 2)


def test_layout_is_disjoint_and_refuses_what_cannot_fit(tmp_path):
    layout = SharedLayout.plan([("a", (3, 5)), ("b", (7,))], workers=3, shards=2, publish_itemsize=2)
    spans = []
    for s in layout.slots:
        spans.append((s.master, s.master + 4 * s.numel))
        spans.append((s.published, s.published + 2 * s.numel))
        spans.extend((g, g + 4 * s.numel) for g in s.grads)
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= layout.nbytes
    huge = SharedLayout.plan([("w", (1 << 40,))], workers=1, shards=1, publish_itemsize=4)
    with pytest.raises(CapacityError):
        huge.check_fits(tmp_path)
    with pytest.raises(ConfigError):
        SharedLayout.plan([], workers=1, shards=1, publish_itemsize=4)


def test_config_validation():
    with pytest.raises(ConfigError):
        DisaggConfig(workers=0)
    with pytest.raises(ConfigError):
        DisaggConfig(hosts=2, host_rank=2)
    assert DisaggConfig.from_toml(DisaggConfig(workers=4).to_toml()).workers == 4
    with pytest.raises(ConfigError) as info:
        launch(DisaggConfig(shm_dir=Path("/no/such/shm")), steps=1)
    assert info.value.context["key"] == "shm_dir"


def _host(rank, out):
    cfg = DisaggConfig(
        workers=2, ps_shards=2, device="cpu", lr=1e-2, hosts=2, host_rank=rank, master_port=29771, step_timeout_s=120
    )
    result = launch(cfg, steps=STEPS)
    torch.save({"losses": result.losses, "masters": result.masters}, out)


@pytest.mark.slow
def test_two_hosts_exchange_through_gloo_and_agree(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # each "host" is its own process, as on real machines
    hosts = [ctx.Process(target=_host, args=(r, str(tmp_path / f"host{r}.pt"))) for r in (0, 1)]
    for h in hosts:
        h.start()
    for h in hosts:
        h.join(600)
    assert [h.exitcode for h in hosts] == [0, 0]
    results = [torch.load(tmp_path / f"host{r}.pt") for r in (0, 1)]
    ref_losses, ref_params = reference(4, STEPS, DisaggConfig(lr=1e-2))
    for name, value in ref_params.items():
        assert torch.equal(results[0]["masters"][name], results[1]["masters"][name]), name
        torch.testing.assert_close(results[0]["masters"][name], value, rtol=1e-5, atol=1e-6)
    assert results[0]["losses"][0] + results[1]["losses"][0] == pytest.approx(ref_losses[0], rel=1e-6)


@pytest.mark.slow
def test_frozen_parameters_stay_out_of_the_segment():
    cfg = DisaggConfig(workers=2, ps_shards=2, device="cpu", lr=1e-2)
    result = launch(cfg, steps=2, model_fn=frozen_embedding_llama)
    model = frozen_embedding_llama()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(trainable, cfg)
    for k in range(2):
        for r in range(2):
            (lm_loss(model, synthetic_batch(k, r, 2)) / 2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert sorted(result.masters) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(result.masters[name], p.detach()), name


@pytest.mark.slow
def test_train_cli_disagg_json():
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "carina",
            "train",
            "--disagg",
            "--workers",
            "2",
            "--ps-shards",
            "1",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--lr",
            "0.01",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout)
    ref_losses, _ = reference(2, 2, DisaggConfig(lr=1e-2))
    assert report["steps"] == 2 and report["losses"] == ref_losses


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_train_cli_two_hosts_on_loopback_hostfile_and_env(tmp_path):
    """Two `carina train --disagg` launchers, node 0 from a hostfile, node 1 from env://, on 127.0.0.1."""
    import json
    import os
    import subprocess
    import sys

    port = _free_port()
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# two node ranks on loopback\n127.0.0.1:{port} slots=1\n127.0.0.1 slots=1  # node 1\n")
    common = ["--disagg", "--ps-shards", "1", "--steps", "2", "--device", "cpu", "--lr", "0.01", "--json"]
    cmd = [sys.executable, "-m", "carina", "train", *common]
    env1 = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": "1"}
    procs = [
        subprocess.Popen([*cmd, "--hosts", str(hostfile), "--node-rank", "0"], stdout=subprocess.PIPE, text=True),
        subprocess.Popen([*cmd, "--rdzv", "env://", "--workers", "1"], stdout=subprocess.PIPE, text=True, env=env1),
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    reports = [json.loads(o) for o in outs]
    assert [(r["config"]["hosts"], r["config"]["host_rank"], r["config"]["workers"]) for r in reports] == [
        (2, 0, 1),
        (2, 1, 1),
    ]
    assert all(r["config"]["master_port"] == port and r["steps"] == 2 for r in reports)
    ref_losses, _ = reference(2, 2, DisaggConfig(lr=1e-2))
    # Each host reports its share; the shares sum to the global loss. Two hosts of one worker each are
    # bitwise equal to one host of two workers (a two-term sum does not depend on the order).
    assert [a + b for a, b in zip(reports[0]["losses"], reports[1]["losses"], strict=True)] == ref_losses
