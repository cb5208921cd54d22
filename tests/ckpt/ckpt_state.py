"""Shared state builders for the carina.ckpt tests."""

from __future__ import annotations

from typing import Any

import torch


def make_state(seed: int = 0) -> dict[str, Any]:
    """A small model + AdamW (with state) + scheduler + extras."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.register_buffer("counts", torch.arange(5, dtype=torch.int64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 16)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    extras = {"pos": 17, "names": ("a", "b"), "by_id": {3: 1.5}, "half": torch.ones(3, dtype=torch.bfloat16)}
    return {"model": model, "optim": opt, "sched": sched, "extras": extras}


def tensors_of(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.clone() for k, v in state["model"].state_dict().items()}
    for pid, s in state["optim"].state_dict()["state"].items():
        for k, v in s.items():
            out[f"optim.{pid}.{k}"] = v.clone()
    return out


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k, x in a.items():
        assert x.dtype == b[k].dtype, k
        assert torch.equal(x.view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)), k


def s3_options(endpoint: str) -> dict[str, Any]:
    """s3fs options for the loopback moto server (its fixed test credentials)."""
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "skip_instance_cache": True}


def two_rank_jobs(root: str, step: int, token: str) -> list[tuple[Any, memoryview]]:
    """The commit jobs (and staged images) of ranks 0 and 1 of one save of a 4-float tensor ``w``."""
    from carina.ckpt.commit import CommitJob
    from carina.ckpt.layout import plan_layout

    layout = plan_layout([("w", "F32", (4,))])
    return [
        (
            CommitJob(root=root, step=step, token=token, rank=rank, world_size=2, header=layout.header,
                      slots=layout.slots, objects={"rank": rank}, keep_last=0, commit_timeout_s=5),
            memoryview(layout.header + bytes(range(16 * rank, 16 * rank + 16))),
        )
        for rank in (0, 1)
    ]  # fmt: skip


def run_ranks(target: Any, args_of: Any, world: int, timeout_s: float = 240) -> list[int | None]:
    """Start ``world`` spawned processes ``target(*args_of(rank))``, wait (killing stragglers), return exit codes."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_of(r)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def timeline_record() -> dict[str, Any]:
    """A save's write timeline (:meth:`carina.ckpt.timeline.Timeline.to_dict`), 20 GiB over 8 s, with known parts.

    Writes from 0.5 s (submitted) to 8.5 s (last completed); the copies done at 3.0 s (the frontier's last
    rise); checksums 9.0 s, fsync 9.5 s, durable 9.8 s, retention done 15.8 s; the feeder waited 0.25 s for
    copies and 6.0 s on a full engine queue. A new dict each call: tests change it.
    """
    gib = 1 << 30
    return {
        "t0": 0.0,
        "every": gib,
        "phases": {"checksummed": 9.0, "fsynced": 9.5, "durable": 9.8, "done": 15.8},
        "waits_s": {"feed_frontier": 0.25, "feed_queue": 6.0},
        "streams": {
            "submitted": [[0.5, 64 << 20], [8.0, 20 * gib]],
            "written": [[1.0, 64 << 20], [8.5, 20 * gib]],
            "frontier": [[0.4, gib], [3.0, 20 * gib]],
        },
    }
