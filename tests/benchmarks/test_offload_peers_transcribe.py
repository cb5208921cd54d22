"""A peers lane log whose harness JSON was lost is transcribed into one record, values as printed."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "offload" / "peers"))

import transcribe_lane_log as tl  # noqa: E402

LOG = """[lane peers8k 10s] wheels: deepspeed 0.19.8
[harness] calibrate: {"cpu_adamw_params_per_s": 4.1e9} in 11 s
[harness] ideal 8192 tokens: 19435 tokens/s (measured (plain PyTorch, uncapped)) in 66 s
[harness] carina 8192 tokens: ok 6486 tokens/s, steps [1.177, 1.263] in 57 s
[harness] fsdp2_cpu_offload 8192 tokens: failed: timed out after 43.2 s in 48 s
[harness] calibrate: {"cpu_adamw_params_per_s": 5.1e9} in 9 s
[harness] ideal 8192 tokens: 19462 tokens/s (measured (plain PyTorch, uncapped)) in 27 s
[harness] carina 8192 tokens: ok 6911 tokens/s, steps [1.185, 1.104] in 43 s
[harness] fsdp2_cpu_offload 8192 tokens: ok 4465 tokens/s, steps [1.833, 1.835] in 57 s
Command: `python benchmarks/offload/peers/harness.py --preset h200-7b16l --tag s7 --out /tmp/x`

| configuration | ideal tok/s | roofline tok/s | carina | fsdp2_cpu_offload |
|---|---|---|---|---|
| s7_7b16l_8192tok_24g | 19435 | 9635 | 6486 (loss ok) | failed |
Command: `python harness.py --preset h200-7b16l --systems carina fsdp2_cpu_offload --tag s7b --out /tmp/x`

| configuration | ideal tok/s | roofline tok/s | carina | fsdp2_cpu_offload |
|---|---|---|---|---|
| s7b_7b16l_8192tok_24g | 19462 | 12101 | 6911 (loss ok) | 4465 (loss ok) |
offload_peers_s7_7b16l_8192tok_24g_carina ok loss within: True max diff: 0.0016 drift: 0.0021 |
offload_peers_s7b_7b16l_8192tok_24g_carina ok loss within: True max diff: 0.0026 drift: 0.0036 |
offload_peers_s7b_7b16l_8192tok_24g_fsdp2_cpu_offload ok loss within: False max diff: 0.5 drift: 0.0022 |
"""


def test_the_second_run_of_a_log_is_read_alone() -> None:
    got = tl.parse(LOG, "s7b")
    assert got["configuration"] == "s7b_7b16l_8192tok_24g"
    assert got["ideal_tokens_per_s"] == 19462.0 and got["roofline_tokens_per_s"] == 12101.0
    assert got["runs"] == {
        "carina": {"tokens": 8192, "tokens_per_s": 6911.0, "steps_s": [1.185, 1.104]},
        "fsdp2_cpu_offload": {"tokens": 8192, "tokens_per_s": 4465.0, "steps_s": [1.833, 1.835]},
    }
    assert got["loss_checks"]["carina"] == {"within_tolerance": True, "max_diff": 0.0026, "drift": 0.0036}
    assert got["loss_checks"]["fsdp2_cpu_offload"]["within_tolerance"] is False
    assert "--tag s7b" in got["command"]


def test_the_first_run_keeps_only_what_succeeded() -> None:
    got = tl.parse(LOG, "s7")
    assert got["runs"] == {"carina": {"tokens": 8192, "tokens_per_s": 6486.0, "steps_s": [1.177, 1.263]}}
    assert set(got["loss_checks"]) == {"carina"}


def test_a_tag_the_log_does_not_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="--tag s9"):
        tl.parse(LOG, "s9")
