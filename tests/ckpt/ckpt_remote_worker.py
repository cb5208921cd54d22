"""One of two spawned gloo ranks checkpointing to the loopback S3 server (tests/ckpt/test_ckpt_remote_dist.py).

``roundtrip``: an FSDP2 model with AdamW and a 7x5 DTensor (``Shard(0)``) is
saved at steps 1 and 2 to a shared local directory and the bucket; then each
rank restores from the bucket alone (an empty local directory of its own) into
a fresh model, the grid now ``Replicate()`` (so each rank reads both shards).
``faults``: step 1 is uploaded; rank 1's upload of step 2 fails before its PUT;
at step 3 rank 1 is SIGKILLed once its local part is durable, before its upload.
Every rank writes ``rank<r>.json``; rank 0 also ``saved<step>.pt``, the full tensors saved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from ckpt_reshard_worker import _bitwise, _full, _grid, _model, _phase
from ckpt_state import s3_options


def _train(model: Any, opt: Any, seed: int) -> None:
    model(torch.randn(4, 10, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()


def _config(tmp: Path, url: str, endpoint: str, local: str, **kw: Any) -> Any:
    from carina.ckpt import Config

    return Config(dir=str(tmp / local), writer="thread", remote=url, remote_options=s3_options(endpoint), **kw)


def _roundtrip(rank: int, tmp: Path, url: str, endpoint: str) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard

    from carina.ckpt import Checkpointer
    from carina.core.errors import CheckpointError

    model, opt = _model(2, seed=0)
    extras = {"grid": _grid((2,), [Shard(0)]), "rank": rank}
    with Checkpointer(_config(tmp, url, endpoint, "ck", keep_last=2)) as ckpt:
        for step in (1, 2):
            _train(model, opt, seed=step)
            ckpt.save(step, {"model": model, "optim": opt, "extras": extras})
        ckpt.wait()  # committed locally, every shard uploaded, rank 0's manifest last
    saved = _full(model, opt, extras)
    if rank == 0:
        torch.save(saved, tmp / "saved2.pt")
    model, opt = _model(2, seed=5)
    state: dict[str, Any] = {"model": model, "optim": opt, "extras": {"grid": _grid((2,), [Replicate()])}}
    ckpt = Checkpointer(_config(tmp, url, endpoint, f"empty{rank}"))
    step = ckpt.restore(state)
    equal = _bitwise(_full(model, opt, state["extras"]), saved)
    verdict = {"step": step, "equal": equal, "rank": state["extras"]["rank"], "local": os.listdir(tmp / f"empty{rank}")}
    try:  # ranks naming different steps: refused on every rank before anything is loaded
        ckpt.restore(state, step=1 + rank)
    except CheckpointError as exc:
        verdict["disagree"] = str(exc)
    verdict["unchanged"] = _bitwise(_full(model, opt, state["extras"]), saved)
    return verdict


def _faults(rank: int, tmp: Path, url: str, endpoint: str) -> dict[str, Any]:
    from torch.distributed.tensor import Shard

    from carina.ckpt import Checkpointer
    from carina.ckpt.remote import RemoteStore
    from carina.core.errors import CheckpointError
    from carina.testing.ckpt import crash_at

    model, opt = _model(2, seed=0)
    state = {"model": model, "optim": opt, "extras": {"grid": _grid((2,), [Shard(0)]), "rank": rank}}
    with Checkpointer(_config(tmp, url, endpoint, "ck", keep_last=0)) as ckpt:
        _train(model, opt, seed=1)
        ckpt.save(1, state)
        ckpt.wait()
    saved = _full(model, opt, state["extras"])  # a collective: every rank gathers
    if rank == 0:
        torch.save(saved, tmp / "saved1.pt")
    verdict: dict[str, Any] = {}
    ckpt = Checkpointer(_config(tmp, url, endpoint, "ck", keep_last=0, commit_timeout_s=2.0))
    if rank == 1:

        def fail(self: RemoteStore, step: int) -> None:
            raise OSError(f"injected: connection reset before rank 1's shard of step {step}")

        RemoteStore._before_data = fail  # type: ignore[method-assign]
    _train(model, opt, seed=2)
    ckpt.save(2, state)
    try:
        ckpt.wait()
    except CheckpointError as exc:
        verdict["error2"] = str(exc)
    if rank == 1:
        (tmp / "rank1.json").write_text(json.dumps(verdict))
        crash_at("part", 3, "trainer")  # its shard is durable locally; it dies before uploading it
    _train(model, opt, seed=3)
    ckpt.save(3, state)
    try:
        ckpt.wait()
    except CheckpointError as exc:
        verdict["error3"] = str(exc)
    return verdict


def worker(rank: int, tmp_dir: str, url: str, endpoint: str, scenario: str) -> None:
    """Run ``scenario`` as rank ``rank`` of 2 and write ``rank<r>.json``."""
    torch.set_num_threads(1)
    tmp = Path(tmp_dir)
    _phase(scenario, rank, 2, tmp)
    run = _roundtrip if scenario == "roundtrip" else _faults
    verdict = run(rank, tmp, url, endpoint)
    (tmp / f"rank{rank}.json").write_text(json.dumps(verdict))
    os._exit(0)  # no teardown: gloo threads (and, in ``faults``, a dead peer)
