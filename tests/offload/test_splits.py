"""Splitting a step's tokens into micro-batches: every split planned, the fastest that fits taken."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from carina.cli.app import app
from carina.core.errors import CapacityError, ConfigError
from carina.offload.splits import Split, best_split, plan_splits, split_candidates

runner = CliRunner()


def test_candidates_are_whole_sequences_fewest_micro_batches_first() -> None:
    assert split_candidates(32768, 2048) == [(1, 32768), (2, 16384), (4, 8192), (8, 4096), (16, 2048)]
    assert split_candidates(6144, 2048) == [(1, 6144), (3, 2048)]
    with pytest.raises(ConfigError, match="multiple of the sequence length"):
        split_candidates(3000, 2048)


def test_best_split_skips_what_does_not_fit_and_names_the_reason_when_nothing_does() -> None:
    def plan_for(tokens: int, micro: int):  # only 4+ micro-batches fit; the planner is not needed here
        if micro < 4:
            raise CapacityError(f"{tokens} tokens of activations do not fit")
        return None

    rows = plan_splits(16384, 2048, plan_for)
    assert [(r.micro_batches, r.reason != "") for r in rows] == [(1, True), (2, True), (4, False), (8, False)]
    with pytest.raises(CapacityError, match="down to 8 micro-batches of 2048 tokens"):
        best_split([Split(micro_batches=8, tokens=2048, reason="too big")])


def test_plan_recommends_one_micro_batch_at_32k_for_the_7b16l_shape_under_24gib() -> None:
    # the H200 rates of session 5's record (offload_s2_7b16l_32k): PCIe 55 GB/s, CPU AdamW 3.8 Gparam/s
    args = ["offload", "plan", "--model", "llama2-7b", "--layers", "16", "--tokens-per-step", "32768",
            "--device-budget", "20.5GB", "--tflops", "600", "--h2d-gbps", "55", "--d2h-gbps", "55",
            "--optim-gparams", "3.8", "--grad-add-gelems", "2", "--cast-gelems", "12", "--json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = {r["micro_batches"]: r for r in out["splits"]}
    assert set(rows) == {1, 2, 4, 8, 16}
    assert (out["micro_batches"], out["tokens"]) == (1, 32768)
    # accumulation leaves the CPU's update and adds after the compute: more micro-batches, longer steps
    assert rows[1]["step_s"] < rows[2]["step_s"] < rows[4]["step_s"]
    assert out["predicted_s"]["cpu_fold"] == 0.0 and rows[4]["cpu_s"] > rows[1]["cpu_s"]
    assert out["bytes"]["device_peak"] <= 20.5 * (1 << 30)  # carina reads GB as GiB
    bad = runner.invoke(app, [*args[:-1], "--tokens-per-step", "1000", "--json"])
    assert bad.exit_code == 2 and "multiple of the sequence length" in bad.output
