"""One GPU: training through the parameter-server path vs carina.offload's direct path.

Both paths run the same model, tokens, device budget and block runtime (carina.offload's
planner, parameter streaming and activation policy). The direct path updates the fp32 masters
with the CPU optimizer inside the training process, overlapped with backward. The PS path
(carina.offload.disagg, one worker, ``--shards`` PS processes) copies every final gradient
into the shared segment, lets the PS shards run the same optimizer there, and copies the
published parameters back. Each path runs in its own process (``--path``), writing a partial
JSON; ``--report`` combines the two into one record and prints a table.

    python benchmarks/offload/disagg/bench_ps_path.py --path direct --out OUT ...
    python benchmarks/offload/disagg/bench_ps_path.py --path ps --out OUT ...
    python benchmarks/offload/disagg/bench_ps_path.py --report --out OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_MAX_TILE = 1 << 20
_T_START = time.perf_counter()  # before torch and transformers are imported: the log says what startup costs


def fast_llama(name: str, layers: int, vocab: int) -> Any:
    """The preset's shape built without HF's slow init: one seeded random tile repeated (same in every process)."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaRotaryEmbedding

    from carina.offload.models import model_config

    overrides: dict[str, Any] = {"use_cache": False}
    if layers:
        overrides["num_hidden_layers"] = layers
    if vocab:
        overrides["vocab_size"] = vocab
    cfg = model_config(name, **overrides)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu")
    tile = torch.randn(_MAX_TILE, generator=torch.Generator().manual_seed(0)) * 0.02
    with torch.no_grad():
        for pname, p in model.named_parameters():
            flat = p.view(-1)
            if "norm" in pname:
                flat.fill_(1.0)
                continue
            for off in range(0, flat.numel(), _MAX_TILE):
                n = min(_MAX_TILE, flat.numel() - off)
                flat[off : off + n].copy_(tile[:n])
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    return model.train()


def token_batch(step: int, rank: int, workers: int, *, rows: int, seq: int, vocab: int) -> Any:
    """Worker ``rank``'s rows of step ``step`` (synthetic tokens, seeded by step)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    batch = torch.randint(0, vocab, (rows * workers, seq), generator=gen)
    return batch[rank * rows : (rank + 1) * rows]


def lm_loss(model: Any, batch: Any) -> Any:
    """Causal-LM loss."""
    return model(input_ids=batch, labels=batch).loss


def _offload_cfg(args: argparse.Namespace) -> Any:
    from carina.memory.tiers import parse_bytes
    from carina.offload.config import OffloadConfig

    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    budget = parse_bytes(args.budget) if args.budget else None  # "" = the whole device
    return OffloadConfig(device=args.device, device_budget=budget, compute_dtype=dtype)


def _model_fn(args: argparse.Namespace) -> Any:
    return functools.partial(fast_llama, args.model, args.layers, args.vocab)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _save_part(args: argparse.Namespace, part: dict[str, Any]) -> None:
    """Write this path's partial JSON now (after every step): a kill keeps what ran."""
    (args.out / f"{args.path}.json").write_text(json.dumps(part, indent=1) + "\n")


def run_direct(args: argparse.Namespace, t_start: float) -> dict[str, Any]:
    """carina.offload.wrap with the CPU optimizer in this process."""
    import torch

    import carina.offload as co

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    _log(f"direct: imports done at {t0 - t_start:.1f} s")
    model = _model_fn(args)()
    vocab = model.config.vocab_size
    params = sum(p.numel() for p in model.parameters())
    _log(f"direct: {params / 1e9:.2f}B-parameter model built in {time.perf_counter() - t0:.1f} s")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)  # the PS runs the same AdamW
    model, opt = co.wrap(model, _offload_cfg(args), optimizer=opt)
    build_s = time.perf_counter() - t0
    _log(f"direct: wrapped, build+wrap {build_s:.1f} s")
    part: dict[str, Any] = {"build_s": build_s, "params": params, "losses": [], "seconds": [], "complete": False}
    for k in range(args.warm + args.steps):
        t = time.perf_counter()
        batch = token_batch(k, 0, 1, rows=args.rows, seq=args.seq, vocab=vocab).to(args.device)
        loss = lm_loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        part["losses"].append(float(loss.detach()))
        part["seconds"].append(time.perf_counter() - t)
        _log(f"direct: step {k} {part['seconds'][-1]:.3f} s loss {part['losses'][-1]:.4f}")
        _save_part(args, part)
    handle = co.handle_of(model)
    part["device_peak"] = handle.stats().peak.get("device")
    part["plan"] = handle.plan.counts() if handle.plan is not None else None
    part["complete"] = True
    return part


def run_ps(args: argparse.Namespace, t_start: float) -> dict[str, Any]:
    """carina.offload.disagg: one worker on the block runtime, the optimizer in PS shard processes."""
    from carina.offload.disagg import DisaggConfig, launch
    from carina.offload.disagg.config import PublishDtype

    cuda = args.device.startswith("cuda")
    cfg = DisaggConfig(
        workers=1,
        ps_shards=args.shards,
        device="cuda" if cuda else "cpu",
        publish_dtype=PublishDtype.BFLOAT16 if cuda else PublishDtype.FLOAT32,
        lr=1e-4,
        weight_decay=0.1,
        offload=_offload_cfg(args),
        ps_threads=max(1, (args.threads - args.worker_threads) // args.shards),
        worker_threads=args.worker_threads,
        step_timeout_s=120,
        shm_dir=args.shm_dir,
    )
    t0 = time.perf_counter()
    model = _model_fn(args)
    from carina.offload.models import model_config

    vocab = args.vocab or model_config(args.model).vocab_size
    batch_fn = functools.partial(token_batch, rows=args.rows, seq=args.seq, vocab=vocab)
    _log(f"ps: launching 1 worker and {args.shards} PS shard(s) at {t0 - t_start:.1f} s")
    result = launch(cfg, steps=args.warm + args.steps, model_fn=model, batch_fn=batch_fn, loss_fn=lm_loss)
    total = time.perf_counter() - t0
    _log(f"ps: steps {[round(x, 3) for x in result.step_seconds]}, launch total {total:.1f} s")
    return {
        "total_s": total,
        "losses": result.losses,
        "seconds": result.step_seconds,
        "config": cfg.to_dict(),
        "complete": True,
    }


def report(out: Path, args: argparse.Namespace) -> int:
    """Combine ``direct.json`` and ``ps.json`` into the record; print a summary table."""
    from carina.core.bench import Figure, make_record, write_record

    parts = {k: json.loads((out / f"{k}.json").read_text()) for k in ("direct", "ps") if (out / f"{k}.json").is_file()}
    tokens = args.rows * args.seq
    rows, meds = [], {}
    for path in ("direct", "ps"):
        part = parts.get(path)
        timed = (part or {}).get("seconds", [])[args.warm :]  # warm steps (profiling included) never count
        if part is None or not timed:
            ran = len(part["seconds"]) if part else 0
            rows.append((path, f"no timed step ({ran} ran)", "", ""))
            continue
        med = statistics.median(timed)
        meds[path] = med
        done = "" if part.get("complete", True) else f" (partial: {len(timed)} timed)"
        rows.append((path, f"{med:.3f}{done}", f"{tokens / med:,.0f}", f"{part['losses'][-1]:.4f}"))
    figures = []
    if "direct" in meds:
        figures.append(Figure(name="direct_step_s", value=meds["direct"], unit="s", higher_is_better=False))
    if "ps" in meds:
        peers = {"direct_path": meds["direct"]} if "direct" in meds else {}
        figures.append(Figure(name="ps_path_step_s", value=meds["ps"], unit="s", higher_is_better=False, peers=peers))
    metrics: dict[str, Any] = {"tokens_per_step": tokens, "warm_steps": args.warm, "measured_steps": args.steps}
    if len(meds) == 2:
        metrics["ps_path_extra"] = meds["ps"] / meds["direct"] - 1
    for path, part in parts.items():
        metrics[path] = {k: v for k, v in part.items() if k != "config"}
    if figures:
        record = make_record(
            name=args.name,
            figures=figures,
            config={k: v for k, v in vars(args).items() if k not in ("out", "report", "path")},
            metrics=metrics,
            command=" ".join(["python", *sys.argv]),
            notes=args.notes,
        )
        print(write_record(record, directory=out))
    print(f"\n{'path':<8} {'median s/step':>14} {'tokens/s':>12} {'last loss':>10}")
    for row in rows:
        print(f"{row[0]:<8} {row[1]:>14} {row[2]:>12} {row[3]:>10}")
    if "ps_path_extra" in metrics:
        print(f"PS path extra time per step: {100 * metrics['ps_path_extra']:+.1f}% (target <= +5%)")
    return 0 if figures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", choices=("direct", "ps"))
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="disagg_ps_path")
    ap.add_argument("--notes", default="")
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--layers", type=int, default=0, help="Truncate to this many blocks (0: the preset's).")
    ap.add_argument("--vocab", type=int, default=0, help="Override the vocabulary (0: the preset's).")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warm", type=int, default=3, help="Steps not timed (the first two profile).")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", default="24GiB")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--shm-dir", type=Path, default=Path("/dev/shm"), help="Where the PS segment lives.")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--worker-threads", type=int, default=4)
    args = ap.parse_args()
    # `timeout` sends SIGTERM: exit through Python so launch() stops its processes and removes its segment.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        return report(args.out, args)
    if args.path is None:
        ap.error("--path or --report")
    t0 = time.perf_counter()
    part = run_direct(args, _T_START) if args.path == "direct" else run_ps(args, _T_START)
    part["wall_s"] = time.perf_counter() - t0
    _save_part(args, part)
    print(f"{args.path}: steps {[round(s, 3) for s in part['seconds']]} wall {part['wall_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
