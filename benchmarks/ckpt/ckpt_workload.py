"""What the ckpt benchmarks train and how they watch host memory.

Two workloads, both fp32 master weights + AdamW (about 12 B per parameter once
the moments exist), bf16 autocast on CUDA:

- ``mlp``: a stack of square Linear+GELU layers (few, large tensors);
- ``llama``: a ``transformers`` LlamaForCausalLM built from a config with random
  init (no weights are downloaded), at the issue's sizes 125M / 350M / 1.3B (GPT-3
  table shapes with a 32000 vocabulary) or, for other counts (the CPU proofs), a
  4-layer model of about that many parameters.

:class:`PeakMemory` samples the resident memory of the trainer and of its
writer children while a method runs.
"""

from __future__ import annotations

import ctypes
import gc
import math
import threading
import time
from typing import Any

import torch

#: params -> (hidden, layers, intermediate, heads): GPT-3 paper shapes, Llama MLP widths.
LLAMA_PRESETS = {125e6: (768, 12, 2048, 12), 350e6: (1024, 24, 2816, 16), 1.3e9: (2048, 24, 5504, 16)}


def build(params: float, device: str, model: str = "mlp") -> tuple[Any, Any, Any]:
    """(model, AdamW, batch) of about ``params`` parameters on ``device``."""
    if model == "llama":
        return _build_llama(params, device)
    hidden = 1024 if device == "cpu" else 4096
    layers = max(2, round(params / (hidden * hidden)))
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden, device=device), torch.nn.GELU()]
    net = torch.nn.Sequential(*mods)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=device == "cuda")
    x = torch.randn(64 if device == "cpu" else 8192, hidden, device=device)
    return net, opt, x


def _llama_shape(params: float) -> tuple[int, int, int, int, int]:
    """(vocab, hidden, layers, intermediate, heads) for ``params``."""
    for p, shape in LLAMA_PRESETS.items():
        if abs(params - p) / p < 0.05:
            return (32000, *shape)
    vocab, layers = 4096, 4  # 2*V*h + L*(4h^2 + 3*h*(8h/3)) = 2Vh + 12Lh^2 = params
    h = (-2 * vocab + math.sqrt(4 * vocab * vocab + 48 * layers * params)) / (24 * layers)
    hidden = max(64, round(h / 64) * 64)
    return vocab, hidden, layers, hidden * 8 // 3 // 64 * 64, hidden // 64


def _build_llama(params: float, device: str) -> tuple[Any, Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, hidden, layers, inter, heads = _llama_shape(params)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=2048,
                      tie_word_embeddings=False)  # fmt: skip
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        net = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=device == "cuda")
    batch, seq = (8, 1024) if device == "cuda" else (2, 64)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    return net, opt, ids


def make_step(model: Any, opt: Any, x: Any, device: str) -> Any:
    """One training step that returns its wall time (the host waits for the loss, as a logging loop does)."""
    llama = not torch.is_floating_point(x)

    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=x, labels=x).loss if llama else model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - t0

    return step


def n_params(model: Any) -> int:
    """Parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


def state_bytes(model: Any, opt: Any) -> int:
    """Bytes of model and optimizer tensors (what every method persists)."""
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for s in opt.state_dict()["state"].values():
        n += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
    return n


def release_host_memory() -> None:
    """Give freed host memory back before the next method: GC, torch's pinned-block cache, glibc's heap."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # cached pinned blocks with pending events are not released
        for fn in ("_host_emptyCache", "_cuda_hostEmptyCache"):
            if hasattr(torch._C, fn):
                getattr(torch._C, fn)()
                break
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _private_bytes(pid: int) -> int:
    """USS of ``pid`` (Private_Clean + Private_Dirty from smaps_rollup): pages only it maps."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


class PeakMemory:
    """High-water host memory of this process (RSS) and of its children (USS) while the block runs.

    ``total`` is trainer RSS + children's private pages at the same sample: a forked
    child's pages still shared copy-on-write with the trainer, and shared-memory
    arenas both map, are counted once. Sampled every ``interval_s`` in a thread.
    """

    def __init__(self, interval_s: float = 0.02, child_every: int = 5) -> None:
        import psutil

        self._proc = psutil.Process()
        self._interval, self._child_every = interval_s, child_every
        self._stop = threading.Event()
        self.before = self.rss_peak = self.children_peak = self.total_peak = 0
        self._kids = 0

    def _sample(self, n: int) -> None:
        rss = self._proc.memory_info().rss
        if n % self._child_every == 0:
            self._kids = sum(_private_bytes(c.pid) for c in self._proc.children(recursive=True))
        self.rss_peak = max(self.rss_peak, rss)
        self.children_peak = max(self.children_peak, self._kids)
        self.total_peak = max(self.total_peak, rss + self._kids)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self._interval):
            self._sample(n)
            n += 1

    def __enter__(self) -> PeakMemory:
        release_host_memory()
        self.before = self._proc.memory_info().rss
        self._sample(0)
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(0)

    def result(self) -> dict[str, float]:
        """GB figures: before, trainer RSS peak, children peak, total peak and total - before."""
        gb = 1e9
        return {"rss_before_GB": self.before / gb, "rss_peak_GB": self.rss_peak / gb,
                "children_peak_GB": self.children_peak / gb, "host_peak_GB": self.total_peak / gb,
                "host_extra_GB": (self.total_peak - self.before) / gb}  # fmt: skip


class ForkTimer:
    """Times every ``os.fork()`` this process makes while active (benchmark-only instrumentation).

    carina's fork writer calls ``os.fork`` through the ``os`` module, so the
    parent's time in ``fork()`` (page-table copy) is seen per save.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []  # (perf_counter at the call, seconds in fork())

    def __enter__(self) -> ForkTimer:
        import os

        self._orig = os.fork

        def timed_fork() -> int:
            t0 = time.perf_counter()
            pid = self._orig()
            if pid:
                self.calls.append((t0, time.perf_counter() - t0))
            return pid

        os.fork = timed_fork
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        os.fork = self._orig

    def since(self, t0: float) -> dict[str, float]:
        """Forks made after ``t0``: their count, total time in fork() and when the first began."""
        calls = [c for c in self.calls if c[0] >= t0]
        if not calls:
            return {}
        return {"forks": len(calls), "fork_s": sum(d for _, d in calls), "fork_after_s": calls[0][0] - t0}


def proc_state(pid: int) -> dict[str, str]:
    """What a (writer) process is doing: its state, kernel wait channel, I/O counters, RSS (for a stuck save)."""
    out: dict[str, str] = {"pid": str(pid)}
    for key, path in (("stat", "stat"), ("wchan", "wchan"), ("io", "io"), ("stack", "stack")):
        try:
            with open(f"/proc/{pid}/{path}") as fh:
                text = fh.read()
        except OSError as exc:
            out[key] = f"({exc.strerror})"
            continue
        if key == "stat":
            text = text.rsplit(")", 1)[-1].split()[0]  # R, S, D, Z...
        out[key] = " ".join(text.split())[:400]
    try:
        with open(f"/proc/{pid}/status") as fh:
            out["VmRSS"] = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("VmRSS")), "")
    except OSError:
        pass
    return out
