import enum
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carina.core.config import VERSION_KEY, Config, choice, require
from carina.errors import ConfigError


class Tier(enum.Enum):
    HOST = "host"
    NVME = "nvme"


@dataclass(kw_only=True)
class Inner(Config):
    depth: int = 4
    ratio: float = 0.5
    tier: Tier = Tier.HOST

    def validate(self) -> None:
        require(self.depth > 0, "depth must be positive", key="depth")


@dataclass(kw_only=True)
class Outer(Config):
    name: str = "job"
    path: Path = Path("/tmp/x")
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    limit: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


class V2(Config):
    VERSION = 2


@dataclass(kw_only=True)
class Migrating(Config):
    VERSION = 2
    size_mb: int = 1

    @classmethod
    def migrate(cls, data, from_version):
        return {"size_mb": data.pop("size_kb") // 1024}


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)
outers = st.builds(
    Outer,
    name=text,
    path=st.builds(Path, st.from_regex(r"/[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True)),
    sizes=st.lists(st.integers(-(2**62), 2**62), max_size=5),
    limit=st.none() | st.integers(0, 2**40),
    tags=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), text, max_size=3),
    inner=st.builds(
        Inner,
        depth=st.integers(1, 1000),
        ratio=st.floats(allow_nan=False, allow_infinity=False, width=32),
        tier=st.sampled_from(Tier),
    ),
)


@given(outers)
def test_round_trip_json_toml_dict(cfg):
    assert Outer.from_dict(cfg.to_dict()) == cfg
    assert Outer.from_json(cfg.to_json()) == cfg
    assert Outer.from_toml(cfg.to_toml()) == cfg


@given(outers, st.from_regex(r"[a-z_]{1,10}", fullmatch=True))
def test_unknown_keys_rejected_at_their_path(cfg, key):
    data = cfg.to_dict()
    if key not in data:
        data[key] = 1
        with pytest.raises(ConfigError) as info:
            Outer.from_dict(data)
        assert info.value.context["key"] == key
    inner = dict(data.get("inner", {}))
    if key not in inner:
        data.pop(key, None)
        data["inner"] = {**inner, key: 1}
        with pytest.raises(ConfigError) as info:
            Outer.from_dict(data)
        assert info.value.context["key"] == f"inner.{key}"


def test_version_is_recorded_and_checked():
    assert Outer().to_dict()[VERSION_KEY] == 1
    with pytest.raises(ConfigError, match="newer"):
        Outer.from_dict({VERSION_KEY: 99})
    with pytest.raises(ConfigError, match="cannot read version"):
        Outer.from_dict({VERSION_KEY: 0})


def test_migration_from_older_version():
    assert Migrating.from_dict({VERSION_KEY: 1, "size_kb": 4096}).size_mb == 4


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"name": 3}, "name"),
        ({"sizes": [1, "x"]}, "sizes[1]"),
        ({"limit": True}, "limit"),
        ({"inner": {"tier": "gpu"}}, "inner.tier"),
        ({"inner": {"depth": 0}}, "inner.depth"),
        ({"inner": 5}, "inner"),
    ],
)
def test_bad_values_name_their_key(data, key):
    with pytest.raises(ConfigError) as info:
        Outer.from_dict(data)
    assert info.value.context["key"] == key


def test_validate_runs_on_direct_construction():
    with pytest.raises(ConfigError):
        Inner(depth=-1)
    assert Inner(ratio=1).ratio == 1.0 and isinstance(Inner(ratio=1).ratio, float)


def test_save_and_load_by_suffix(tmp_path):
    cfg = Outer(name="a", inner=Inner(tier=Tier.NVME))
    for suffix in (".toml", ".json"):
        path = cfg.save(tmp_path / f"c{suffix}")
        assert Outer.load(path) == cfg
    assert json.loads((tmp_path / "c.json").read_text())["inner"]["tier"] == "nvme"


def test_malformed_text_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        Outer.from_toml("name = ")
    with pytest.raises(ConfigError):
        Outer.from_json("{")
    with pytest.raises(ConfigError):
        Outer.load(tmp_path / "missing.toml")


def test_choice_parses_enum_values_and_names_the_key():
    assert choice(Tier, "host", key="tier") is Tier.HOST
    assert choice(Tier, Tier.HOST, key="tier") is Tier.HOST
    with pytest.raises(ConfigError) as info:
        choice(Tier, "floppy", key="tier")
    assert info.value.context["key"] == "tier" and "floppy" in str(info.value)
