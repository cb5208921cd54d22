"""Where the save of a carina.offload-wrapped model blocks: lent host state against copies inside save().

carina.offload keeps the float32 masters and AdamW moments in host RAM. ``lent``: the
optimizer lends them (``lend_state``) and the checkpointer copies them behind training
under a write guard; ``copied``: the same objects passed through a wrapper without
``lend_state``, so ``state_dict()`` clones the masters and the stager copies every host
tensor inside ``save()`` (what carina did before lending). Both in one process, same
model, alternating saves. Per save: ``blocking_s`` (inside ``save``), ``next_step_s``
(the training step right after, which the write guards may hold up; two untimed saves first touch
both arenas) against the median
clean step, and for the first timed save of each mode a profile of ``save`` (seconds in
``copy_``, ``clone``, the state tree and the rest).

    python benchmarks/ckpt/bench_offload_blocking.py --model demo --device cpu --reps 3
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from typing import Any

from stall_record import env

from carina.core.bench import Figure, make_record, write_record


class Copied:
    """Hides ``lend_state``: the checkpointer then copies this value's tensors inside ``save()``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def state_dict(self) -> Any:
        return self.inner.state_dict()

    def load_state_dict(self, sd: Any) -> None:
        self.inner.load_state_dict(sd)


def _profile(fn: Any) -> dict[str, float]:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(fn)
    total = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    own = {"copy_": 0.0, "clone": 0.0}
    tree = 0.0
    for (file, _line, name), (_cc, _nc, tt, ct, _callers) in stats.items():
        for key in own:
            if name == f"<method '{key}' of 'torch._C.TensorBase' objects>":
                own[key] += tt
        if file.endswith("carina/ckpt/tree.py") and name == "flatten":
            tree += ct
    return {"total_s": round(total, 4), "copy_s": round(own["copy_"], 4), "clone_s": round(own["clone"], 4),
            "flatten_s": round(tree, 4), "other_s": round(total - own["copy_"] - own["clone"] - tree, 4)}  # fmt: skip


def main() -> None:
    import torch

    import carina.offload as co
    from carina.ckpt import Checkpointer, Config, WriterKind
    from carina.offload.models import build_model, model_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", default=None, help="device budget (carina.memory sizes), default none")
    ap.add_argument("--tokens", default="2x64", help="micro-batch x sequence length")
    ap.add_argument("--writer", default="thread")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    from carina.memory.tiers import parse_bytes

    batch, seq = (int(x) for x in args.tokens.split("x"))
    cfg = model_config(args.model)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    budget = parse_bytes(args.budget) if args.budget else None
    model, opt = co.wrap(model, co.Config(device=args.device, device_budget=budget), optimizer=opt)
    gen = torch.Generator().manual_seed(0)

    def step() -> float:
        t0 = time.perf_counter()
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(args.device)
        model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    clean = [step() for _ in range(6)][2:]
    modes = {"lent": {"model": model, "optim": opt}, "copied": {"model": Copied(model), "optim": Copied(opt)}}
    rows: dict[str, dict[str, Any]] = {m: {"blocking_s": [], "next_step_s": []} for m in modes}
    with tempfile.TemporaryDirectory(prefix="carina-offload-blocking-") as root:
        ckpts = {m: Checkpointer(Config(dir=f"{root}/{m}", writer=WriterKind(args.writer), keep_last=1)) for m in modes}
        for m, state in modes.items():  # untimed: the writer and both arenas (their pages touched once)
            for warm in (-1, 0):
                ckpts[m].save(warm, state)
                ckpts[m].wait()
        for rep in range(1, args.reps + 1):
            for m, state in modes.items():
                clean.append(step())
                if rep == 1:
                    rows[m]["profile"] = _profile(lambda m=m, state=state, rep=rep: ckpts[m].save(rep, state))
                    rows[m]["blocking_s"].append(rows[m]["profile"]["total_s"])
                else:
                    rows[m]["blocking_s"].append(ckpts[m].save(rep, state).blocked_s)
                rows[m]["next_step_s"].append(step())
                rows[m]["lent_slots"], rows[m]["guard_copied_slots"] = ckpts[m].lent_copies()
                ckpts[m].wait()
        for c in ckpts.values():
            c.close()
    base = statistics.median(clean)
    summary = []
    for m, r in rows.items():
        summary.append({"mode": m, "blocking_s_median": round(statistics.median(r["blocking_s"]), 4),
                        "next_step_extra_s_median": round(statistics.median(r["next_step_s"]) - base, 4),
                        "blocking_s": [round(x, 4) for x in r["blocking_s"]], "profile": r["profile"],
                        "lent_slots": r["lent_slots"], "guard_copied_slots": r["guard_copied_slots"]})  # fmt: skip
    lent, copied = summary[0], summary[1]
    figures = [Figure(name="save_blocking_lent", value=lent["blocking_s_median"], unit="s", higher_is_better=False,
                      peers={"copied_in_save": copied["blocking_s_median"]}, ceiling_source="none (0 s)")]  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    metrics = {"summary": summary, "params": params, "clean_step_s_median": round(base, 4)}
    config = {k: getattr(args, k) for k in ("model", "device", "budget", "tokens", "writer", "reps")}
    notes = (f"carina.offload-wrapped {args.model} ({params / 1e6:.1f}M params) on {args.device}, AdamW; saves "
             f"with the {args.writer} writer, lent state against the same state copied inside save(), alternating "
             "in one process; the first timed save of each mode is profiled (cProfile: its overhead is in "
             "total_s and other_s).")  # fmt: skip
    name = args.name or f"ckpt_offload_blocking_{args.device}"
    rec = make_record(name=name, figures=figures, config=config, metrics=metrics, notes=notes, environment=env())
    print(write_record(rec), file=sys.stderr, flush=True)
    for row in summary:
        print(row, file=sys.stderr)


if __name__ == "__main__":
    main()
