"""Two gloo ranks on CPU: each writes its shard, rank 0 commits one manifest after both are durable."""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
from pathlib import Path

import pytest

from carina.ckpt import Checkpointer, Config, WriterKind
from carina.ckpt.storage import read_manifest
from carina.core.errors import CheckpointError
from carina.testing.ckpt import dist_worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_gloo_ranks(tmp_path: Path) -> None:
    ckpt_dir, out = tmp_path / "ck", tmp_path / "out"
    out.mkdir()
    ctx = mp.get_context("spawn")
    for _attempt in range(2):  # a free port can be taken by another process before gloo binds it
        port = _free_port()
        procs = [ctx.Process(target=dist_worker, args=(r, 2, port, str(ckpt_dir), str(out))) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
            if p.is_alive():
                p.kill()
                p.join()
        if all(p.exitcode == 0 for p in procs):
            break
    assert [p.exitcode for p in procs] == [0, 0]
    verdicts = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert verdicts == [{"ok": True, "step": 3}, {"ok": True, "step": 3}]
    m = read_manifest(str(ckpt_dir / "step_0000000003"))
    assert m.world_size == 2 and sorted(s.rank for s in m.shards) == [0, 1]
    assert m.objects["1"]["extras"] == {"rank": 1}
    # One process restores a 2-rank checkpoint: rank-local state comes from rank 0 (0 mod 2).
    ckpt = Checkpointer(Config(dir=str(ckpt_dir), writer=WriterKind.SYNC))
    state = {"extras": None}
    assert ckpt.restore(state) == 3 and state["extras"] == {"rank": 0}
    with pytest.raises(CheckpointError, match="lacks state 'nothing'"):
        ckpt.restore({"nothing": None})
    ckpt.close()
