from __future__ import annotations

from pathlib import Path

import pytest

from carina.core.errors import ConfigError
from carina.infra.provision.config import IscsiBacking, ProvisionConfig, check_name


def test_round_trip_and_unknown_keys(tmp_path: Path) -> None:
    cfg = ProvisionConfig(state_dir=tmp_path, nbd_port=10900, iscsi_backing=IscsiBacking.RAW_COPY)
    again = ProvisionConfig.load(cfg.save(tmp_path / "p.toml"))
    assert again == cfg and again.db_url.startswith("sqlite:///") and again.node_boot_url.endswith(":8470")
    with pytest.raises(ConfigError) as info:
        ProvisionConfig.from_toml("nbd_prot = 1\n")
    assert info.value.context["key"] == "nbd_prot"


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"nbd_port": 0}, "nbd_port"),
        ({"http_port": 70000}, "http_port"),
        ({"tgt_control_port": 40000}, "tgt_control_port"),
        ({"link_rate_bps": -1}, "link_rate_bps"),
        ({"iqn_prefix": "com.example"}, "iqn_prefix"),
        ({"iscsi_backing": "nfs"}, "iscsi_backing"),
    ],
)
def test_invalid_values_name_their_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProvisionConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.context["key"] == key


@pytest.mark.parametrize("bad", ["", "-x", "UPPER", "a_b", "a/b", "x" * 49, "../etc"])
def test_names(bad: str) -> None:
    with pytest.raises(ConfigError):
        check_name(bad, key="name")
    assert check_name("node-01.rack2", key="name") == "node-01.rack2"


def test_project_names_have_no_dots(prov) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="must not contain"):
        prov.create_project("a.b")
