"""Which implementation of the user's optimizer updates the masters, and the allocator setting."""

from __future__ import annotations

import warnings

import pytest
import torch
from offload_fixtures import tiny_llama, train_losses

import carina.offload as co
from carina.core.errors import ConfigError
from carina.offload.profiler import inner_kwargs as _inner_kwargs


def _opt(**kwargs):
    return torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3, **kwargs)


def test_auto_keeps_the_users_settings_on_cpu_and_fuses_for_a_cuda_device():
    cfg = co.Config(device="cpu")
    assert _inner_kwargs(_opt(), cfg, torch.device("cpu"))["fused"] is None
    assert _inner_kwargs(_opt(), cfg, torch.device("cuda", 0))["fused"] is True
    # a user who chose an implementation keeps it, device or not
    assert _inner_kwargs(_opt(foreach=True), cfg, torch.device("cuda", 0))["fused"] is None
    assert _inner_kwargs(_opt(foreach=True), cfg, torch.device("cuda", 0))["foreach"] is True


def test_as_given_and_fused_modes():
    given = co.Config(device="cpu", cpu_optimizer=co.CpuOptimizerImpl.AS_GIVEN)
    assert _inner_kwargs(_opt(), given, torch.device("cuda", 0))["fused"] is None
    fused = co.Config(device="cpu", cpu_optimizer="fused")
    assert _inner_kwargs(_opt(), fused, torch.device("cpu"))["fused"] is True
    no_fused = torch.optim.Adadelta(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(ConfigError, match="Adadelta has no fused implementation") as err:
        _inner_kwargs(no_fused, fused, torch.device("cpu"))
    assert err.value.context["key"] == "cpu_optimizer"


def test_fused_masters_train_bitwise_like_plain_fused_adamw():
    # carina steps each block's flat masters with one fused call (carina.offload.flatstep); the kernel is
    # elementwise, so losses and weights equal plain fused AdamW's bit for bit. (Before the chosen
    # implementation reached the param groups, the user's group "fused": None won and this ran the loop.)
    model = tiny_llama()
    ref = train_losses(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), 6)
    weights = [p.detach().clone() for p in model.parameters()]
    model = tiny_llama()
    cfg = co.Config(device="cpu", device_budget=1_300_000, cpu_optimizer="fused")
    model, opt = co.wrap(model, cfg, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    got = train_losses(model, opt, 6)
    assert got == ref
    opt.synchronize()  # the last blocks' updates may still run when step() returns
    assert all(torch.equal(a, b) for a, b in zip(weights, opt.masters, strict=True))
    inner = co.handle_of(model).optimizer.inner
    assert inner.defaults["fused"] is True and all(g["fused"] is True for g in inner.param_groups)


def test_carinas_choice_reaches_every_param_group_and_the_users_is_kept():
    model = tiny_llama()
    user = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _, opt = co.wrap(model, co.Config(device="cpu", cpu_optimizer="fused"), optimizer=user)
    assert [(g["fused"], g["foreach"]) for g in opt.inner.param_groups] == [(True, None)]
    model = tiny_llama()
    user = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _, opt = co.wrap(model, co.Config(device="cpu"), optimizer=user)  # auto on a CPU device: as the user said
    assert [(g["fused"], g["foreach"]) for g in opt.inner.param_groups] == [(None, True)]


def test_allocator_mode_round_trips_and_rejects_unknown_values():
    cfg = co.Config(allocator="as_is")
    assert cfg.allocator is co.AllocatorMode.AS_IS
    assert co.Config.from_dict(cfg.to_dict()).allocator is co.AllocatorMode.AS_IS
    with pytest.raises(ConfigError):
        co.Config(allocator="huge_pages")


def _record_setting(calls: list[tuple[str, str]], which: str):
    return lambda settings: calls.append((which, settings))


def test_allocator_auto_uses_the_accelerator_call_without_a_deprecation_warning(monkeypatch):
    from carina.offload import api

    calls: list[tuple[str, str]] = []
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    setter = _record_setting(calls, "accelerator")
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", setter, raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", _record_setting(calls, "cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        api._set_up_allocator(co.Config(allocator="auto"))
    assert calls == [("accelerator", "expandable_segments:True")]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")  # the user's setting wins under auto
    api._set_up_allocator(co.Config(allocator="auto"))
    api._set_up_allocator(co.Config(allocator="as_is"))
    assert calls == [("accelerator", "expandable_segments:True")]
    api._set_up_allocator(co.Config(allocator="expandable"))  # explicit: set even over the user's variable
    assert calls == [("accelerator", "expandable_segments:True")] * 2


def test_allocator_falls_back_to_the_cuda_call_on_an_older_torch(monkeypatch):
    from carina.offload import api

    calls: list[tuple[str, str]] = []
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", _record_setting(calls, "cuda"))
    api._set_up_allocator(co.Config(allocator="auto"))
    assert calls == [("cuda", "expandable_segments:True")]


def test_the_real_accelerator_call_accepts_carinas_setting():
    # on the installed torch (2.13 CPU here, 2.11 CUDA on the H100) the call exists and takes the string
    assert hasattr(torch._C, "_accelerator_setAllocatorSettings")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
