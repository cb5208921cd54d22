import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carina.errors import ConfigError, ModelFormatError
from carina.infra.cluster.collectives import free_port
from carina.infra.cluster.rendezvous import from_hostfile


def test_hostfile_rendezvous(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# rack 1\nnode-a:29600\nnode-b  # spare\nnode-c\n")
    rdv = from_hostfile(str(hosts), rank=2)
    assert (rdv.init_method, rdv.rank, rdv.world) == ("tcp://node-a:29600", 2, 3)
    assert from_hostfile("env://").rank is None
    with pytest.raises(ConfigError, match="pass --rank"):
        from_hostfile(str(hosts))  # this machine is none of node-a/b/c
    with pytest.raises(ConfigError):
        from_hostfile(str(hosts), rank=3)
    hosts.write_text("node-a\nnode b:x\n")
    with pytest.raises(ModelFormatError) as info:
        from_hostfile(str(hosts), rank=0)
    assert info.value.context["line"] == 2


@given(st.text(max_size=200))
def test_hostfile_parser_never_crashes_otherwise(tmp_path_factory, text):
    hosts = tmp_path_factory.mktemp("h") / "hosts"
    hosts.write_text(text)
    try:
        rdv = from_hostfile(str(hosts), rank=0)
    except (ModelFormatError, ConfigError):
        return
    assert rdv.init_method.startswith("tcp://") and rdv.world >= 1


@pytest.mark.slow
def test_check_nodes_over_a_hostfile_runs_on_every_rank(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1:{free_port()}\n127.0.0.1\n127.0.0.1\n")
    cmd = [sys.executable, "-m", "carina", "cluster", "check", "--nodes", str(hosts), "--nbytes", "65536", "--json"]
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs][1:] == [0, 0]  # only rank 0 reports (and may exit 1 if a link is slow)
    report = json.loads(outs[0][0])
    assert sorted(report["pairwise_gbps"]) == ["0-1", "0-2", "1-2"]
    assert sorted(report["ring_gbps"]) == ["0-1", "1-2", "2-0"]
    assert procs[0].returncode == (1 if report["slow"]["links"] else 0)
    assert outs[1][0] == outs[2][0] == ""
