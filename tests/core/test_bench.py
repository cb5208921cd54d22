import json

import pytest

from carina.core import flags
from carina.core.bench import (
    SCHEMA,
    Basis,
    Figure,
    load_records,
    machine_label,
    make_record,
    render_markdown,
    write_record,
)
from carina.errors import ConfigError, ModelFormatError

ENV = {"torch": {"gpus": []}}


def test_ratios_follow_direction():
    up = Figure(name="bw", value=1.2, unit="GB/s", ceiling=1.5, peers={"a": 0.6, "z": 0.0})
    assert up.ratio_to_ceiling() == pytest.approx(0.8)
    assert up.ratio_to_peers() == {"a": pytest.approx(2.0), "z": None}
    down = Figure(name="stall", value=2.0, unit="s", higher_is_better=False, ceiling=1.0, peers={"b": 8.0})
    assert down.ratio_to_ceiling() == pytest.approx(0.5)
    assert down.ratio_to_peers() == {"b": pytest.approx(4.0)}
    assert Figure(name="x", value=1, unit="u").ratio_to_ceiling() is None


def test_record_round_trip_and_markdown(tmp_path):
    figs = [
        Figure(name="bw", value=1.2, unit="GB/s", ceiling=1.5, ceiling_source="fio", peers={"numpy": 0.6}),
        Figure(name="model", value=3.0, unit="x", basis=Basis.MODELED),
    ]
    rec = make_record(
        name="demo", figures=figs, config={"qd": 8}, command="bench --x", environment=ENV, metrics={"runs": 3}
    )
    assert rec["schema"] == SCHEMA and rec["machine"]["label"] == "cpu" and rec["command"] == "bench --x"
    assert rec["figures"][0]["peers"]["numpy"] == {"value": 0.6, "ratio": pytest.approx(2.0)}
    path = write_record(rec, directory=tmp_path)
    assert path == tmp_path / "demo.json"
    [back] = load_records(tmp_path)
    assert back == json.loads(json.dumps(rec))
    table = render_markdown([back], title="t")
    assert "| demo | cpu | bw | 1.2 GB/s | measured | 80% of 1.5 GB/s | numpy 0.6 (2x) |" in table
    assert "| demo | cpu | model | 3 x | modeled | – | – |" in table


def test_results_dir_flag(tmp_path):
    rec = make_record(name="r", figures=[], config={}, command="c", environment=ENV)
    with flags.override(CARINA_RESULTS_DIR=str(tmp_path / "out")):
        assert write_record(rec).parent == tmp_path / "out"


def test_source_commit_names_a_copied_trees_commit():
    from carina.core.bench import git_state

    seen = git_state()
    plain = make_record(name="r", figures=[], config={}, command="c", environment=ENV)
    assert (plain["git_sha"], plain["git_dirty"]) == seen and "git_sha_seen" not in plain
    with flags.override(CARINA_SOURCE_COMMIT="0123abcd"):
        rec = make_record(name="r", figures=[], config={}, command="c", environment=ENV)
    assert rec["git_sha"] == "0123abcd" and rec["git_dirty"] is False
    assert (rec["git_sha_seen"], rec["git_dirty_seen"]) == seen


def test_bad_records_are_rejected(tmp_path):
    (tmp_path / "bad.json").write_text('{"schema": "carina.bench/1"}')
    with pytest.raises(ModelFormatError, match="lacks"):
        load_records(tmp_path)
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ModelFormatError) as info:
        load_records(tmp_path / "bad.json")
    assert info.value.context["file"].endswith("bad.json")
    with pytest.raises(ConfigError):
        make_record(name="a/b", figures=[], config={}, environment=ENV)


def test_machine_label():
    assert machine_label({"torch": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}}) == "h100"
    assert machine_label({"torch": {"gpus": []}}) == "cpu"


def test_committed_records_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    files = sorted(root.rglob("*.json")) if root.exists() else []
    for rec in load_records(files):
        assert rec["command"], rec["name"]


def test_records_do_not_name_this_checkouts_path():
    from carina.core.bench import _REPO

    env = {"torch": {"gpus": []}, "python": {"executable": str(_REPO / ".venv/bin/python")}}
    rec = make_record(
        name="p", figures=[], config={"dir": str(_REPO / "x")}, command=f"{_REPO}/bench.py", environment=env
    )
    assert str(_REPO) not in json.dumps(rec)
    assert rec["environment"]["python"]["executable"] == "python"
