"""chunked_lm_loss: transformers' causal-LM loss with one chunk's logits alive at a time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from offload_fixtures import VOCAB, big_vocab_llama, tiny_llama, token_batches
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import carina.offload as co
from carina.core.errors import ConfigError, ModelFormatError
from carina.offload.estimate import ShapeEstimate, estimate_profile, saved_bytes
from carina.offload.planner import PlanBudgets, make_plan
from carina.offload.simulator import Hardware

TOKENS = 2 * 32  # token_batches: 2 sequences of 32


def tiny_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4, use_cache=False,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(cfg)  # the head is tied to the token embedding


def tiny_qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_cache=False)  # fmt: skip
    return Qwen2ForCausalLM(cfg)


MODELS: dict[str, Callable[[], nn.Module]] = {"llama": lambda: tiny_llama(2), "gpt2": tiny_gpt2, "qwen2": tiny_qwen2}


def _labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[0, :7] = -100  # a masked prompt
    labels[1, 20:] = -100  # padding
    return labels


def _loss_and_grads(model: nn.Module, fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = fn()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("chunk", [16, 23])  # 23: an uneven last chunk (64 = 2 x 23 + 18)
def test_loss_and_every_gradient_match_transformers(family: str, chunk: int):
    model = MODELS[family]()
    ids = token_batches(1)[0]
    labels = _labels(ids)
    ref, ref_grads = _loss_and_grads(model, lambda: model(input_ids=ids, labels=labels).loss)
    got, grads = _loss_and_grads(model, lambda: co.chunked_lm_loss(model, ids, labels, chunk_tokens=chunk))
    assert len(grads) == len(ref_grads) == len(list(model.parameters()))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [TOKENS, 10 * TOKENS])
def test_one_chunk_is_bitwise_transformers(chunk: int):
    model = tiny_llama(2)
    ids = token_batches(1)[0]
    labels = _labels(ids)
    ref, ref_grads = _loss_and_grads(model, lambda: model(input_ids=ids, labels=labels).loss)
    got, grads = _loss_and_grads(model, lambda: co.chunked_lm_loss(model, ids, labels, chunk_tokens=chunk))
    assert torch.equal(got, ref)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads, strict=True))


def test_labels_default_to_the_inputs_and_ignored_labels_count_nothing():
    model = tiny_llama(2)
    ids = token_batches(1)[0]
    ref = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(co.chunked_lm_loss(model, ids, chunk_tokens=16), ref, rtol=1e-6, atol=0)
    # a chunk of ignored labels only: the mean runs over the valid tokens, not all of them
    labels = ids.clone()
    labels[0, :] = -100
    ref = model(input_ids=ids, labels=labels).loss
    got = co.chunked_lm_loss(model, ids, labels, chunk_tokens=16)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    assert not torch.equal(got, co.chunked_lm_loss(model, ids, chunk_tokens=16))


class LogitsWatch(TorchDispatchMode):
    """Records the largest tensor whose last dimension is the vocabulary, allocated by any op (views skipped)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # (the head weight's transpose in backward is V wide, and no allocation)
            return out
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("chunk", [8, 20])
def test_no_tensor_larger_than_one_chunk_of_logits_exists(chunk: int):
    model = big_vocab_llama()
    ids = token_batches(1)[0] % VOCAB
    plain = LogitsWatch(VOCAB)
    with plain:
        model(input_ids=ids, labels=ids).loss.backward()
    assert plain.largest == TOKENS * VOCAB  # the watch sees the whole logits of the plain loss
    watch = LogitsWatch(VOCAB)
    with watch:
        co.chunked_lm_loss(model, ids, chunk_tokens=chunk).backward()
    assert watch.largest == chunk * VOCAB  # forward and backward (the chunks' recomputation included)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, chunk: int) -> list[float]:
    losses = []
    for batch in token_batches(steps):
        ids = batch % VOCAB * 13 % VOCAB
        loss = co.chunked_lm_loss(model, ids, chunk_tokens=chunk) if chunk else model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _wrapped(budget: int, chunk: int) -> tuple[nn.Module, co.OffloadOptimizer]:
    model = big_vocab_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = co.Config(device="cpu", device_budget=budget, head_chunk_tokens=chunk)
    return co.wrap(model, cfg, optimizer=opt)  # type: ignore[return-value]


def test_wrapped_model_trains_like_plain_and_plans_one_chunk_of_workspace():
    model = big_vocab_llama()
    ref = _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), 5, 0)
    budget = 6_600_000
    wrapped, opt = _wrapped(budget, 16)
    got = _train(wrapped, opt, 5, 16)
    assert got[:2] == pytest.approx(ref[:2], rel=1e-5)  # profiling steps
    assert got == pytest.approx(ref, rel=1e-4)
    handle = co.handle_of(wrapped)
    assert handle.plan is not None and handle.stats().peak["device"] <= budget
    assert opt.profile is not None
    assert opt.profile.head_workspace_bytes == 3 * 4 * 16 * VOCAB  # one chunk's logits, not 64 tokens'
    assert opt.profile.other_act_bytes < 4 * TOKENS * VOCAB  # no saved log-softmax of all the logits


def test_bad_arguments_name_what_is_wrong():
    model = tiny_llama(2)
    ids = token_batches(1)[0]
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ConfigError) as err:
            co.chunked_lm_loss(model, ids, chunk_tokens=bad)  # type: ignore[arg-type]
        assert err.value.context["key"] == "chunk_tokens"
    with pytest.raises(ConfigError) as err:
        co.chunked_lm_loss(model, ids, ids[:, :5])
    assert err.value.context["key"] == "labels"
    with pytest.raises(ModelFormatError) as fmt:
        co.chunked_lm_loss(model.model, ids)  # the base model: no output layer
    assert "output layer" in str(fmt.value) and fmt.value.context["model"] == "LlamaModel"
    with pytest.raises(ConfigError) as err:
        co.Config(head_chunk_tokens=-1)
    assert err.value.context["key"] == "head_chunk_tokens"


def test_estimate_shrinks_the_head_to_one_chunk_and_the_7b_32k_plan_keeps_blocks():
    from carina.offload.models import model_config

    cfg = model_config("llama2-7b", num_hidden_layers=16)
    tokens, chunk = 32768, 4096
    block, other, work = saved_bytes(cfg, tokens, 2)
    c_block, c_other, c_work = saved_bytes(cfg, tokens, 2, head_chunk_tokens=chunk)
    head_input = tokens * cfg.hidden_size * 2
    assert c_block == block and other == 4 * tokens * cfg.vocab_size + head_input and c_other == head_input
    assert work == 12 * tokens * cfg.vocab_size
    assert c_work == 16 * chunk * cfg.vocab_size + head_input
    assert saved_bytes(cfg, tokens, 2, head_chunk_tokens=tokens) == (block, other, work)  # one chunk: plain
    hw = Hardware(h2d=50e9, d2h=50e9, optim=3e9, disk=1e9)
    budgets = PlanBudgets(device=int(0.9 * 24 * 2**30 * 0.95), host=None)
    plans = [make_plan(estimate_profile(cfg, ShapeEstimate(tokens, 2048, 600, 2, c)), budgets, hw) for c in (0, chunk)]
    plain, chunked = (p.counts() for p in plans)
    assert plain["keep"] == 0 and chunked["keep"] > 0
    assert all(p.device_peak <= (budgets.device or 0) for p in plans)


def test_train_cli_chunks_the_loss_when_asked_and_auto_decides_by_the_logits_size():
    import json

    from typer.testing import CliRunner

    from carina.cli.app import app
    from carina.offload.chunkloss import AUTO_CHUNK_TOKENS, loss_chunk_tokens

    args = ["train", "--model", "tiny", "--steps", "3", "--seq-len", "32", "--device", "cpu", "--lr", "0.01",
            "--json"]  # fmt: skip
    runs = {n: CliRunner().invoke(app, [*args, "--loss-chunk-tokens", str(n)]) for n in (0, 24)}
    assert all(r.exit_code == 0 for r in runs.values()), [r.output for r in runs.values()]
    plain, chunked = (json.loads(runs[n].stdout) for n in (0, 24))
    assert plain["result"]["loss_chunk_tokens"] == 0 and chunked["result"]["loss_chunk_tokens"] == 24
    assert chunked["result"]["losses"] == pytest.approx(plain["result"]["losses"], rel=1e-5)
    bad = CliRunner().invoke(app, [*args, "--loss-chunk-tokens", "-2"])
    assert bad.exit_code == 2 and "loss_chunk_tokens" in bad.output
    # auto: the plain loss for the demo's 64 x 256 logits, chunks for 32k tokens x 32000
    assert loss_chunk_tokens(-1, 64, 256) == 0
    assert loss_chunk_tokens(-1, 32768, 32000) == AUTO_CHUNK_TOKENS
    assert loss_chunk_tokens(-1, 4096, 32000) == 0  # one chunk would be the whole micro-batch


def test_offload_plan_cli_takes_the_head_chunk():
    import json

    from typer.testing import CliRunner

    from carina.cli.app import app

    base = ["offload", "plan", "--model", "llama2-7b", "--layers", "16", "--tokens", "32768", "--json"]
    plain, chunked = (
        json.loads(CliRunner().invoke(app, [*base, "--head-chunk-tokens", n]).stdout) for n in ("0", "4096")
    )
    assert chunked["head_chunk_tokens"] == 4096
    assert chunked["blocks"]["keep"] > plain["blocks"]["keep"]
    assert CliRunner().invoke(app, [*base, "--head-chunk-tokens", "-1"]).exit_code == 2


def test_without_a_chunk_the_loss_takes_the_wrapped_models_planned_chunk():
    from carina.offload.chunkloss import AUTO_CHUNK_TOKENS, chunk_tokens_for

    model = big_vocab_llama()
    assert chunk_tokens_for(model) == AUTO_CHUNK_TOKENS  # not wrapped
    assert chunk_tokens_for(model, 7) == 7
    wrapped, opt = _wrapped(6_600_000, 16)
    assert co.handle_of(wrapped).config.head_chunk_tokens == 16
    assert chunk_tokens_for(wrapped) == 16 and chunk_tokens_for(wrapped, 8) == 8
    ids = token_batches(1)[0] % VOCAB
    watch = LogitsWatch(VOCAB)
    with watch:
        loss = co.chunked_lm_loss(wrapped, ids)  # no chunk given: the Config's 16 tokens
        loss.backward()
    opt.step()
    assert watch.largest == 16 * VOCAB
    ref = big_vocab_llama()(input_ids=ids, labels=ids).loss  # the same weights, unwrapped, plain head
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-6, atol=1e-7)
    plain_wrapped, _ = _wrapped(6_600_000, 0)
    assert chunk_tokens_for(plain_wrapped) == AUTO_CHUNK_TOKENS


def test_train_cli_head_chunk_tokens_is_the_loss_chunk_and_reaches_the_plan():
    import json

    from typer.testing import CliRunner

    from carina.cli.app import app
    from carina.offload.config import OffloadConfig
    from carina.offload.job import TrainConfig, _loss_chunk, run

    args = ["train", "--model", "tiny", "--steps", "3", "--seq-len", "32", "--device", "cpu", "--lr", "0.01",
            "--json"]  # fmt: skip
    runs = {
        flag: CliRunner().invoke(app, [*args, flag, "24"]) for flag in ("--head-chunk-tokens", "--loss-chunk-tokens")
    }
    assert all(r.exit_code == 0 for r in runs.values()), [r.output for r in runs.values()]
    head, loss = (json.loads(r.stdout)["result"] for r in runs.values())
    assert head["loss_chunk_tokens"] == loss["loss_chunk_tokens"] == 24
    assert head["losses"] == loss["losses"]  # one option under two names: the same run, bit for bit
    # a chunk set in the offload config is the loss's when the loss chunk is left at auto; 0 is the plain loss
    planned = OffloadConfig(head_chunk_tokens=24)
    assert _loss_chunk(TrainConfig(model="tiny", offload=planned), 64, 256) == 24
    assert _loss_chunk(TrainConfig(model="tiny", offload=planned, loss_chunk_tokens=0), 64, 256) == 0
    assert _loss_chunk(TrainConfig(model="tiny", offload=planned, loss_chunk_tokens=8), 64, 256) == 8
    assert _loss_chunk(TrainConfig(model="tiny"), 64, 256) == 0  # auto, small logits: the plain loss
    for loss_chunk, expect in ((-1, 24), (0, 0)):  # what wrap() was told: the chunk the loss runs
        seen: list[int] = []
        job = TrainConfig(model="tiny", steps=1, seq_len=32, loss_chunk_tokens=loss_chunk,
                          offload=OffloadConfig(device="cpu", head_chunk_tokens=24))  # fmt: skip
        result = run(job, resume=lambda m, o, seen=seen: seen.append(co.handle_of(m).config.head_chunk_tokens) or 0)
        assert seen == [expect] and result.loss_chunk_tokens == expect


def _plan(*extra: str) -> tuple[int, str, dict | None]:
    import json

    from typer.testing import CliRunner

    from carina.cli.app import app

    base = ["offload", "plan", "--model", "llama2-7b", "--layers", "16"]
    run = CliRunner().invoke(app, [*base, *extra])
    return run.exit_code, run.output, json.loads(run.stdout) if "--json" in extra and run.exit_code == 0 else None


def test_offload_plan_hints_at_the_chunked_head_when_it_predicts_a_faster_step():
    _, _, plain = _plan("--tokens", "32768", "--json")
    _, _, chunked = _plan("--tokens", "32768", "--head-chunk-tokens", "4096", "--json")
    assert plain is not None and chunked is not None
    hint = plain["head_chunk_hint"]
    assert hint == {"head_chunk_tokens": 4096, "predicted_step_s": chunked["predicted_s"]["step"],
                    "plain_step_s": plain["predicted_s"]["step"], "blocks": chunked["blocks"]}  # fmt: skip
    assert hint["predicted_step_s"] < hint["plain_step_s"] and hint["blocks"]["keep"] > plain["blocks"]["keep"]
    assert chunked["head_chunk_hint"] is None  # the user chose the chunk
    code, text, _ = _plan("--tokens", "32768")
    assert code == 0 and "hint: the chunked head (--head-chunk-tokens 4096" in " ".join(text.split())
    # 8k: a hint exactly when the chunked plan is the faster one; 4k: one chunk is the whole micro-batch
    _, _, plain8 = _plan("--tokens", "8192", "--json")
    _, _, chunked8 = _plan("--tokens", "8192", "--head-chunk-tokens", "4096", "--json")
    assert plain8 is not None and chunked8 is not None
    faster = chunked8["predicted_s"]["step"] < plain8["predicted_s"]["step"]
    assert (plain8["head_chunk_hint"] is not None) == faster
    _, _, plain4 = _plan("--tokens", "4096", "--json")
    assert plain4 is not None and plain4["head_chunk_hint"] is None


def test_offload_plan_that_does_not_fit_says_when_the_chunked_head_would():
    code, text, _ = _plan("--tokens", "32768", "--device-budget", "14GB")
    flat = " ".join(text.split())
    assert code == 2 and "head workspace" in flat
    assert "hint: the chunked head (--head-chunk-tokens 4096" in flat and "where the plain loss does not fit" in flat
    code, _, fits = _plan("--tokens", "32768", "--device-budget", "14GB", "--head-chunk-tokens", "4096", "--json")
    assert code == 0 and fits is not None and fits["bytes"]["device_peak"] <= 14e9
    code, text, _ = _plan("--tokens", "32768", "--device-budget", "4GB")  # fits neither way: no hint
    assert code == 2 and "hint" not in text
