"""Run in a fresh process: peak host RSS of a wrapped Llama whose optimizer state spills to NVMe.

Prints one JSON line: the process's resident bytes before the model is built, the model's bytes,
the peak (``VmHWM``) from ``wrap()`` through the profiling steps, the plan (made at the end of
the last profiling step, with its hardware probes) and the planned steps, and what the plan and
the ledgers say. Used by ``test_host_rss.py``.

``--late-spill`` makes the profiling steps keep the first block that the static plan spills in
RAM, so the plan spills one block more than profiling did (as on the H100 in session 13: 12
blocks while profiling, 13 in the plan).
"""

from __future__ import annotations

import argparse
import json

import torch
from setup_rss_probe import _status  # the sibling probe's /proc/self/status reader (this folder is on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--host-fraction", type=float, default=0.7, help="host budget: this x 20 B per parameter")
    ap.add_argument("--device-budget", type=int, default=160 << 20)
    ap.add_argument("--steps", type=int, default=2, help="planned steps after profiling")
    ap.add_argument("--late-spill", action="store_true")
    ap.add_argument("--nvme", required=True)
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    import carina.offload as co

    torch.set_num_threads(1)
    cfg = LlamaConfig(
        vocab_size=4096,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_cache=False,
    )
    out: dict[str, object] = {"rss_start": _status("VmRSS")}
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).train()
    numel = sum(p.numel() for p in model.parameters())
    out["model_bytes"] = 4 * numel
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    budget = int(args.host_fraction * 20 * numel)
    ocfg = co.Config(
        device="cpu",
        device_budget=args.device_budget,
        host_budget=budget,
        nvme_path=args.nvme,
        nvme_budget=20 * numel,
        activations="recompute",
    )
    out["host_budget"] = budget
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on
    out["rss_before_wrap"] = _status("VmRSS")
    model, opt = co.wrap(model, ocfg, optimizer=opt)
    handle = co.handle_of(model)
    out["static_spill"] = sorted(opt.spill)
    if args.late_spill and opt.spill:
        opt.spill.discard(min(opt.spill))
    gen = torch.Generator().manual_seed(1)
    losses, peaks = [], [_status("VmHWM")]
    for _ in range(ocfg.profile_steps + args.steps):
        ids = torch.randint(0, cfg.vocab_size, (1, 32), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        handle.synchronize()
        peaks.append(_status("VmHWM"))
    plan = handle.plan
    assert plan is not None
    stats = handle.stats()
    out.update(
        rss_peak=_status("VmHWM"),
        rss_peaks=peaks,  # after wrap, then after each step (cumulative)
        rss_end=_status("VmRSS"),
        planned_host_bytes=plan.host_bytes,
        planned_device_peak=plan.device_peak,
        ledger_host_peak=stats.peak["host"],
        ledger_device_peak=stats.peak["device"],
        plan_spill=[i for i, b in enumerate(plan.blocks) if b.state_on_nvme],
        state_bytes_per_block=8 * handle.runtime.blocks[0].numel,
        process_baseline=handle.process_baseline,
        losses=losses,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
