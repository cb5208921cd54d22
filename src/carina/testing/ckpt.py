"""A tiny Llama (or MLP) trainer with checkpoints and crash injection, for carina.ckpt tests.

Run as a program so a test can SIGKILL it at a chosen point and start it again::

    python -m carina.testing.ckpt --dir D --steps 8 --save-every 2 --writer fork \\
        [--resume] [--crash-phase rename --crash-step 4 --crash-target writer|trainer]

It prints one JSON line: ``{"start": s, "losses": [hex floats...], "params_sha256": ...}``.
Losses are ``float.hex`` strings, so comparisons are bitwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from typing import Any, ClassVar

__all__ = [
    "FakeCopyEvent",
    "GatedCopies",
    "TinyLM",
    "crash_at",
    "dist_worker",
    "main",
    "make_model",
    "params_digest",
    "train",
]

VOCAB, SEQ, BATCH = 64, 16, 4


class TinyLM:
    """A 2-layer MLP language model (no transformers import: fast to start)."""

    def __new__(cls) -> Any:
        import torch

        class _LM(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = torch.nn.Embedding(VOCAB, 32)
                self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, VOCAB))

            def forward(self, input_ids: Any, labels: Any) -> Any:
                logits = self.mlp(self.emb(input_ids))
                loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))
                return type("Out", (), {"loss": loss})()

        return _LM()


class FakeCopyEvent:
    """FAKE: stands in for the CUDA event of a device-to-host staging copy still in flight.

    CPU tests have no CUDA copies, so every snapshot is complete at ``save``. On a
    GPU it is not: writers must start later, once the copy is done. ``query()`` is
    False until :meth:`finish` (or ``synchronize()``) is called.
    """

    def __init__(self) -> None:
        self.finished = False

    def finish(self) -> None:
        """The copy is done."""
        self.finished = True

    def query(self) -> bool:
        """Whether the copy is done (never blocks)."""
        return self.finished

    def synchronize(self) -> None:
        """Wait for the copy (here: finish it)."""
        self.finished = True


def GatedCopies(gate: Any, hold_in_copy: bool = False) -> Any:
    """A :class:`carina.ckpt.hostcopy.LazyCopies` whose background thread waits for ``gate`` (a threading.Event).

    A slow background copy, on demand: with ``hold_in_copy=False`` the thread copies nothing
    until the gate opens (every slot stays pending, so a write guard must copy them itself);
    with ``True`` it claims the first slot and holds it mid-copy (a guard must wait). Each
    instance made is appended to the returned class's ``made``.
    """
    import threading

    from carina.ckpt.hostcopy import LazyCopies

    class _Gated(LazyCopies):
        made: ClassVar[list[Any]] = []

        def __init__(self, pairs: Any) -> None:
            self.holding = threading.Event()  # set once the background thread holds its first slot
            type(self).made.append(self)
            super().__init__(pairs)

        def _run(self) -> None:
            if not hold_in_copy:
                gate.wait()
            super()._run()

        def _copy(self, i: int) -> None:
            if hold_in_copy and threading.current_thread() is self._thread:
                self.holding.set()
                gate.wait()
            super()._copy(i)

    return _Gated


def make_model(kind: str = "llama", seed: int = 0) -> Any:
    """A seeded tiny model: ``llama`` (2-layer LlamaForCausalLM) or ``mlp`` (:class:`TinyLM`)."""
    import torch

    torch.manual_seed(seed)
    if kind == "mlp":
        return TinyLM()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        attention_dropout=0.0,
    )
    return LlamaForCausalLM(cfg)


def params_digest(model: Any) -> str:
    """sha256 over every parameter's bytes, in name order."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def crash_at(phase: str, step: int, target: str) -> None:
    """Install a fault hook that SIGKILLs at ``phase`` of the save of ``step``.

    ``target="writer"`` kills the process running the pipeline (the fork child);
    ``"trainer"`` kills the trainer (with the thread or sync writer they are the same).
    """
    from carina.ckpt import commit

    trainer = os.getpid()

    def hook(now: str, now_step: int) -> None:
        if now == phase and now_step == step:
            os.kill(os.getpid() if target == "writer" else trainer, signal.SIGKILL)

    commit.fault_hook = hook


def train(
    ckpt_dir: str, steps: int, save_every: int, writer: str, *, resume: bool = False, model_kind: str = "llama"
) -> dict[str, Any]:
    """Train to ``steps``, checkpointing every ``save_every`` steps; resume from the newest checkpoint."""
    import numpy as np
    import torch

    from carina.ckpt import Checkpointer, Config, WriterKind

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = make_model(model_kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    data = torch.Generator().manual_seed(1234)
    np.random.seed(7)
    extras: dict[str, Any] = {"data": data.get_state(), "noise_seed": 0}
    start = 0
    with Checkpointer(Config(dir=ckpt_dir, writer=WriterKind(writer), keep_last=2)) as ckpt:
        if resume:
            state = {"model": model, "optim": opt, "sched": sched, "extras": extras}
            start = ckpt.restore(state)
            data.set_state(state["extras"]["data"])
        losses = []
        for step in range(start + 1, steps + 1):
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=data)
            noise = float(np.random.rand()) * 1e-3  # numpy RNG must resume too
            loss = model(input_ids=tokens, labels=tokens).loss + noise * torch.randn(()).abs()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.item()).hex())
            if step % save_every == 0:
                extras["data"] = data.get_state()
                ckpt.save(step, {"model": model, "optim": opt, "sched": sched, "extras": extras})
        ckpt.wait()
    return {"start": start, "losses": losses, "params_sha256": params_digest(model)}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m carina.testing.ckpt")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--writer", default="fork")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--model", default="llama", choices=["llama", "mlp"])
    ap.add_argument("--crash-phase")
    ap.add_argument("--crash-step", type=int, default=0)
    ap.add_argument("--crash-target", default="writer", choices=["writer", "trainer"])
    args = ap.parse_args(argv)
    if args.crash_phase:
        crash_at(args.crash_phase, args.crash_step, args.crash_target)
    out = train(args.dir, args.steps, args.save_every, args.writer, resume=args.resume, model_kind=args.model)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def dist_worker(rank: int, world: int, port: int, ckpt_dir: str, out_dir: str) -> None:
    """One gloo rank: save a rank-specific state, restore it into fresh objects, write a verdict file."""
    import torch
    import torch.distributed as dist

    from carina.ckpt import Checkpointer, Config, WriterKind

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(100 + rank)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        with Checkpointer(Config(dir=ckpt_dir, writer=WriterKind.FORK)) as ckpt:
            ckpt.save(3, {"model": model, "optim": opt, "extras": {"rank": rank}})
            ckpt.wait()
            dist.barrier()  # rank 0's commit waits for every shard; all see it after this
            ckpt.wait()
            dist.barrier()
            torch.manual_seed(999)
            fresh = torch.nn.Linear(8, 8)
            fopt = torch.optim.AdamW(fresh.parameters())
            state: dict[str, Any] = {"model": fresh, "optim": fopt, "extras": None}
            step = ckpt.restore(state)
        ok = step == 3 and state["extras"] == {"rank": rank}
        ok = ok and all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump({"ok": ok, "step": step}, fh)
    finally:
        dist.destroy_process_group()
