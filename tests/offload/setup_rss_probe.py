"""Run in a fresh process: host RAM of a wrapped Llama from before wrap() to the end of profiling.

Prints one JSON line. ``VmHWM`` is reset (``/proc/self/clear_refs`` = 5) before each phase, so each
peak is that phase's own. Used by ``test_setup_memory.py`` and ``benchmarks/offload/bench_setup_rss.py``.
"""

from __future__ import annotations

import argparse
import json

import torch


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--fraction", type=float, default=None, help="profile_host_fraction (None: default)")
    ap.add_argument("--steps", type=int, default=0, help="planned steps after profiling")
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    import carina.offload as co

    torch.set_num_threads(1)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
        use_cache=False,
    )
    out: dict[str, object] = {"rss_start": _status("VmRSS")}
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).train()
    out["model_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    out["rss_after_init"] = _status("VmRSS")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    extra = {} if args.fraction is None else {"profile_host_fraction": args.fraction}
    ocfg = co.Config(device="cpu", device_budget=1 << 30, compute_dtype=args.dtype, **extra)
    _reset_peak()
    model, opt = co.wrap(model, ocfg, optimizer=opt)
    out["rss_peak_wrap"] = _status("VmHWM")
    out["rss_after_wrap"] = _status("VmRSS")
    handle = co.handle_of(model)
    gen = torch.Generator().manual_seed(1)
    losses = []

    def step() -> None:
        ids = torch.randint(0, cfg.vocab_size, (args.rows, args.seq), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))

    _reset_peak()
    for _ in range(ocfg.profile_steps):
        step()  # the profiling steps: the plan is made at the end of the last
    st = handle.stats()
    out["rss_peak_profile"] = _status("VmHWM")
    out["ledger_host_peak_profile"] = st.peak["host"]
    out["ledger_device_peak_profile"] = st.peak["device"]
    assert handle.plan is not None
    out["planned_host_bytes"] = handle.plan.host_bytes
    out["plan_actions"] = [b.activation.value for b in handle.plan.blocks]
    out["act_bytes"] = [g.act_bytes for g in handle.runtime.blocks]
    if args.steps:
        handle.store.reset_peaks()
        _reset_peak()
        for _ in range(args.steps):
            step()
        out["rss_peak_planned"] = _status("VmHWM")
        out["ledger_host_peak_planned"] = handle.stats().peak["host"]
    out["losses"] = losses
    print(json.dumps(out))


if __name__ == "__main__":
    main()
