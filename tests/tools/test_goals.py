import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("goals", REPO / "tools" / "goals.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["goals"] = module
    spec.loader.exec_module(module)
    return module


goals = _load()

FIGURE = {"unit": "x", "higher_is_better": True, "basis": "measured", "ceiling": None, "ceiling_source": ""}
RECORD = {
    "schema": "carina.bench/1",
    "name": "demo",
    "git_sha": "0" * 40,
    "machine": {"label": "m"},
    "command": "made by hand for this test",
    "config": {},
    "environment": {},
    "figures": [
        {**FIGURE, "name": "tokens_per_s", "value": 17054.0, "ratio_to_ceiling": 0.8784, "peers": {}},
        {**FIGURE, "name": "tflops", "value": 300.5, "ratio_to_ceiling": None, "peers": {}},
    ],
    "metrics": {
        "fraction_of_roofline": 0.8949,
        "nested": {"flag": True, "text": "x"},
        "summary": [
            {"method": "carina-process", "durable_s": 14.035, "durable_bound_s": 10.5812},
            {"method": "torch.save", "durable_s": 9.0, "durable_bound_s": 10.5811},
        ],
    },
}


def _toml(tmp_path, body: str) -> Path:
    file = tmp_path / "goals.toml"
    file.write_text(body)
    return file


def _entry(**over):
    entry = {
        "subsystem": "offload",
        "goal": "demo goal",
        "record": "m/demo.json",
        "path": "metrics.fraction_of_roofline",
        "op": ">=",
        "target": 0.9,
    }
    entry.update(over)
    return entry


@pytest.fixture
def results(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "demo.json").write_text(json.dumps(RECORD))
    return tmp_path


def test_lookup_reads_metrics_and_figures_by_name():
    assert goals.lookup(RECORD, "metrics.fraction_of_roofline") == 0.8949
    assert goals.lookup(RECORD, "figures.tokens_per_s.ratio_to_ceiling") == 0.8784
    assert goals.lookup(RECORD, "figures.tflops.value") == 300.5


def test_lookup_matches_names_that_hold_dots_whole():
    record = {
        "figures": [
            {"name": "pcie_bw", "value": 1.0},
            {"name": "pcie_bw.h2d_gbps", "value": 53.96, "peers": {"torch.save": {"ratio": 2.5}}},
        ],
        "metrics": {"pairs_gt_0.98": 152},
    }
    assert goals.lookup(record, "figures.pcie_bw.value") == 1.0
    assert goals.lookup(record, "figures.pcie_bw.h2d_gbps.value") == 53.96
    assert goals.lookup(record, "figures.pcie_bw.h2d_gbps.peers.torch.save.ratio") == 2.5
    assert goals.lookup(record, "metrics.pairs_gt_0.98") == 152.0
    with pytest.raises(goals.GoalError, match="no key 'torch'"):
        goals.lookup(record, "figures.pcie_bw.h2d_gbps.peers.torch.load.ratio")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("metrics.missing", "no key 'missing'"),
        ("figures.absent.value", "0 list items named 'absent'"),
        ("metrics.nested.flag", "not a number (True)"),
        ("metrics.nested.text", "not a number ('x')"),
    ],
)
def test_lookup_names_what_is_wrong(path, why):
    with pytest.raises(goals.GoalError, match=why.replace("(", r"\(").replace(")", r"\)")):
        goals.lookup(RECORD, path)


def test_judge_applies_the_operator_at_the_boundary(results):
    assert goals.judge(_entry(target=0.8949), results) == (0.8949, 0.8949, True)
    assert goals.judge(_entry(target=0.9), results) == (0.8949, 0.9, False)
    assert goals.judge(_entry(op="<=", target=0.8949), results)[2] is True
    assert goals.judge(_entry(op="<", target=0.8949), results)[2] is False


def test_a_target_read_from_the_record_and_rows_named_by_method(results):
    entry = _entry(path="metrics.summary.carina-process.durable_s", op="<=")
    del entry["target"]
    entry["target_path"] = "metrics.summary.carina-process.durable_bound_s"
    assert goals.judge(entry, results) == (14.035, 10.5812, False)
    entry["path"] = "metrics.summary.torch.save.durable_s"
    entry["target_path"] = "metrics.summary.torch.save.durable_bound_s"
    assert goals.judge(entry, results) == (9.0, 10.5811, True)


def test_between_is_two_sided(results):
    assert goals.judge(_entry(op="between", target=[0.85, 1.15]), results) == (0.8949, [0.85, 1.15], True)
    assert goals.judge(_entry(op="between", target=[0.9, 1.1]), results)[2] is False


def test_judge_refuses_a_missing_record(results):
    with pytest.raises(goals.GoalError, match=r"no record m/none\.json"):
        goals.judge(_entry(record="m/none.json"), results)


def test_judge_refuses_a_record_that_is_not_a_bench_record(results):
    (results / "m" / "bare.json").write_text(json.dumps({"metrics": {"fraction_of_roofline": 0.95}}))
    with pytest.raises(Exception, match="record lacks 'schema'"):
        goals.judge(_entry(record="m/bare.json"), results)


def test_goal_errors_are_carina_config_errors():
    from carina.core.errors import ConfigError

    assert issubclass(goals.GoalError, ConfigError)


def test_load_goals_rejects_unknown_fields_and_operators(tmp_path):
    ok = 'subsystem="s"\ngoal="g"\nrecord="r"\npath="p"\ntarget=1\n'
    with pytest.raises(goals.GoalError, match=r"goal 1: unknown \['colour'\], missing \['op'\]"):
        goals.load_goals(_toml(tmp_path, "[[goal]]\n" + ok + 'colour="red"\n'))
    with pytest.raises(goals.GoalError, match="op '=>' is not one of"):
        goals.load_goals(_toml(tmp_path, "[[goal]]\n" + ok + 'op="=>"\n'))
    with pytest.raises(goals.GoalError, match="'between' takes target = \\[lo, hi\\]"):
        goals.load_goals(_toml(tmp_path, "[[goal]]\n" + ok + 'op="between"\n'))
    with pytest.raises(goals.GoalError, match="goal 1: give exactly one of target and target_path"):
        goals.load_goals(_toml(tmp_path, "[[goal]]\n" + ok + 'op=">="\ntarget_path="metrics.x"\n'))


def test_rendered_status_is_computed_and_a_miss_carries_its_note(tmp_path, results, monkeypatch):
    monkeypatch.setattr(goals, "REPO", tmp_path)
    body = (
        '[[goal]]\nsubsystem="offload"\ngoal="met one"\nrecord="m/demo.json"\n'
        'path="figures.tokens_per_s.ratio_to_ceiling"\nop=">="\ntarget=0.85\nunit="fraction"\nnote="unused"\n'
        '[[goal]]\nsubsystem="offload"\ngoal="missed one"\nrecord="m/demo.json"\n'
        'path="metrics.fraction_of_roofline"\nop=">="\ntarget=0.9\nunit="fraction"\nnote="disk shared"\n'
    )
    table = goals.render_goals(_toml(tmp_path, body), results).splitlines()
    assert table[2] == "| offload | met one | 87.8% | >= 85.0% | met | `m/demo.json` |"
    assert table[3] == "| offload | missed one | 89.5% | >= 90.0% | **not met**: disk shared | `m/demo.json` |"


def test_the_committed_goals_all_resolve_to_numbers():
    entries = goals.load_goals(REPO / "docs" / "goals.toml")
    assert entries, "docs/goals.toml lists no goal"
    for entry in entries:
        value, target, _ = goals.judge(entry)
        assert target == target
        assert value == value  # a number, not NaN
