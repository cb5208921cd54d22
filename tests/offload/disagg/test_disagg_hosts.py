"""The multi-host options of `carina train --disagg`: hostfile parser (outside input), env://, the CLI's checks."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from carina.cli.train import app
from carina.errors import ConfigError
from carina.offload.disagg.hosts import (
    DEFAULT_PORT,
    HostEntry,
    Rendezvous,
    from_env,
    from_hostfile,
    parse_hostfile,
    resolve,
)
from carina.offload.train_cli import disagg_config

GOOD = """\
# a two-node job
10.0.0.1:29700 slots=4   # node 0, the rendezvous

node-b.example.com   slots=4
[fd00::3] slots=4
"""


def test_parses_hosts_ports_slots_and_line_numbers():
    assert parse_hostfile(GOOD, source="hf") == [
        HostEntry(host="10.0.0.1", port=29700, slots=4, line=2),
        HostEntry(host="node-b.example.com", port=None, slots=4, line=4),
        HostEntry(host="[fd00::3]", port=None, slots=4, line=5),
    ]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a slots=1\nb:x slots=1\n", 2, "is not host or host:port"),
        ("a:0 slots=1\n", 1, "not in 1..65535"),
        ("a:70000 slots=1\n", 1, "not in 1..65535"),
        ("a\n", 1, "missing slots=N"),
        ("a slots=0\n", 1, "not a positive count"),
        ("a slots=-2\n", 1, "not a positive count"),
        ("a slots=two\n", 1, "not a positive count"),
        ("a slots=1 slots=1\n", 1, "slots given twice"),
        ("a slots=1 gpus=2\n", 1, "unknown field 'gpus=2'"),
        ("a slots=1\n\n# c\nb:29500 slots=1\n", 4, "only the first host"),
        ("a slots=2\nb slots=2\nc slots=3\n", 3, "differs from slots=2 on line 1"),
        ("-a slots=1\n", 1, "is not host or host:port"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(text, line, words):
    with pytest.raises(ConfigError) as info:
        parse_hostfile(text, source="cluster.hosts")
    assert str(info.value).startswith(f"cluster.hosts:{line}: ")
    assert words in info.value.message
    assert info.value.context == {"key": "hosts", "path": "cluster.hosts", "line": line}


def test_an_empty_file_says_no_hosts():
    with pytest.raises(ConfigError, match=r"^f: no hosts"):
        parse_hostfile("# nothing\n\n   \n", source="f")


_NAME = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(
    hosts=st.lists(_NAME, min_size=1, max_size=6),
    port=st.none() | st.integers(1, 65535),
    slots=st.integers(1, 999),
    pad=st.lists(st.sampled_from(["", "   ", "# comment", "\t# x slots=9"]), min_size=7, max_size=7),
)
def test_formatted_entries_parse_back(hosts, port, slots, pad):
    lines, expected = [], []
    for i, host in enumerate(hosts):
        lines.append(pad[i])
        head = host if i or port is None else f"{host}:{port}"
        lines.append(f" {head}\tslots={slots}  # node {i}")
        expected.append(HostEntry(host=host, port=port if i == 0 else None, slots=slots, line=len(lines)))
    assert parse_hostfile("\n".join(lines), source="h") == expected


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=120) | st.from_regex(r"[a-z0-9.:\[\] =#\n-]{0,80}"))
def test_any_text_parses_or_fails_with_a_config_error_that_names_a_real_line(text):
    try:
        entries = parse_hostfile(text, source="h")
    except ConfigError as exc:
        line = exc.context.get("line")
        if line is not None:
            assert str(exc).startswith(f"h:{line}: ")
            assert text.split("\n")[line - 1].split("#", 1)[0].strip()  # it names a non-blank line
        return
    assert entries and all(e.slots == entries[0].slots >= 1 for e in entries)
    assert all(e.port is None for e in entries[1:])


def test_from_hostfile_takes_the_rendezvous_from_line_one(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("h0 slots=2\nh1 slots=2\n")
    assert from_hostfile(path, 1) == Rendezvous(
        hosts=2, host_rank=1, master_addr="h0", master_port=DEFAULT_PORT, slots=2
    )
    with pytest.raises(ConfigError, match=r"node rank 2 is not in 0\.\.1") as info:
        from_hostfile(path, 2)
    assert info.value.context["key"] == "node_rank"
    with pytest.raises(ConfigError, match="cannot read hostfile") as info:
        from_hostfile(tmp_path / "missing", 0)
    assert info.value.context["path"] == str(tmp_path / "missing")


ENV = {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29800", "WORLD_SIZE": "3", "RANK": "2"}


def test_env_reads_torch_distributed_variables():
    assert from_env(ENV) == Rendezvous(hosts=3, host_rank=2, master_addr="10.1.1.1", master_port=29800)
    assert from_env({**ENV, "MASTER_ADDR": "fd00::1"}).master_addr == "[fd00::1]"  # bracketed for tcp://


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"MASTER_ADDR": None}, "MASTER_ADDR"),
        ({"MASTER_ADDR": "two words"}, "MASTER_ADDR"),
        ({"MASTER_ADDR": "[::1]:29500"}, "MASTER_ADDR"),
        ({"MASTER_PORT": None}, "MASTER_PORT"),
        ({"MASTER_PORT": "99999"}, "MASTER_PORT"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"RANK": "-1"}, "RANK"),
        ({"RANK": "3"}, "RANK"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "RANK"),
    ],
)
def test_env_errors_name_the_variable(change, key):
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        from_env(env)
    assert info.value.context["key"] == key


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"hostfile": Path("h"), "rdzv": "env://"}, "rdzv"),
        ({"rdzv": "tcp://a:1"}, "rdzv"),
        ({"rdzv": "env://", "node_rank": 0}, "node_rank"),
        ({"hostfile": Path("h")}, "node_rank"),
        ({"node_rank": 1}, "node_rank"),
    ],
)
def test_conflicting_options_are_refused(kw, key):
    with pytest.raises(ConfigError) as info:
        resolve(**{"hostfile": None, "node_rank": None, "rdzv": None, "environ": ENV, **kw})
    assert info.value.context["key"] == key


def test_disagg_config_places_this_host(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1:29900 slots=3\n127.0.0.1 slots=3\n")
    params = {"workers": None, "ps_shards": 2, "hosts": path, "node_rank": 1, "rdzv": None, "device": "cpu", "lr": None}
    cfg = disagg_config(params)
    assert (cfg.hosts, cfg.host_rank, cfg.workers, cfg.master_addr, cfg.master_port) == (2, 1, 3, "127.0.0.1", 29900)
    with pytest.raises(ConfigError, match="--workers 2 but") as info:
        disagg_config({**params, "workers": 2})
    assert info.value.context["key"] == "workers"
    env_cfg = disagg_config({**params, "hosts": None, "node_rank": None, "rdzv": "env://", "workers": 4}, ENV)
    assert (env_cfg.hosts, env_cfg.host_rank, env_cfg.workers, env_cfg.master_port) == (3, 2, 4, 29800)
    assert disagg_config({**params, "hosts": None, "node_rank": None}).hosts == 1


def test_cli_exits_2_naming_the_hostfile_line(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 slots=1\n127.0.0.1 slot=1\n")
    res = CliRunner().invoke(app, ["--disagg", "--hosts", str(path), "--node-rank", "0", "--device", "cpu"])
    assert res.exit_code == 2
    assert f"{path}:2: unknown field 'slot=1'" in res.output.replace("\n", "")
    res = CliRunner().invoke(app, ["--hosts", str(path), "--node-rank", "0"])
    assert res.exit_code == 2 and "need --disagg" in res.output
