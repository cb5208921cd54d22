import pytest

from carina.core import flags
from carina.errors import ConfigError

DEPTH = flags.define("CARINA_TEST_DEPTH", int, 4, "test flag")
ON = flags.define("CARINA_TEST_ON", bool, False, "test flag")


def test_default_env_override_order(monkeypatch):
    monkeypatch.delenv("CARINA_TEST_DEPTH", raising=False)
    assert DEPTH.get() == 4 and DEPTH.source() == "default"
    monkeypatch.setenv("CARINA_TEST_DEPTH", "9")
    assert DEPTH.get() == 9 and DEPTH.source() == "env"
    with flags.override(CARINA_TEST_DEPTH=12):
        assert DEPTH.get() == 12 and DEPTH.source() == "override"
    assert DEPTH.get() == 9


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("yes", True), ("off", False), ("", False)])
def test_bool_parsing(monkeypatch, raw, value):
    monkeypatch.setenv("CARINA_TEST_ON", raw)
    assert ON.get() is value


def test_bad_env_value_names_the_flag(monkeypatch):
    monkeypatch.setenv("CARINA_TEST_DEPTH", "many")
    with pytest.raises(ConfigError) as info:
        DEPTH.get()
    assert info.value.context["key"] == "CARINA_TEST_DEPTH"


def test_override_checks_name_and_type():
    with pytest.raises(ConfigError), flags.override(CARINA_NOPE=1):
        pass
    with pytest.raises(ConfigError), flags.override(CARINA_TEST_DEPTH="3"):
        pass
    with pytest.raises(ConfigError), flags.override(CARINA_TEST_DEPTH=True):
        pass


def test_definitions_are_checked():
    assert flags.define("CARINA_TEST_DEPTH", int, 4, "again") is DEPTH
    with pytest.raises(ConfigError):
        flags.define("CARINA_TEST_DEPTH", str, "4", "other type")
    with pytest.raises(ConfigError):
        flags.define("NOT_CARINA", int, 1, "bad prefix")
    assert "CARINA_TEST_DEPTH" in flags.all_flags()


def test_no_other_module_reads_carina_environment():
    from pathlib import Path

    import carina

    root = Path(carina.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "flags.py" and path.parent.name == "core":
            continue
        text = path.read_text()
        for needle in ('environ.get("CARINA_', "environ['CARINA_", 'environ["CARINA_', 'getenv("CARINA_'):
            if needle in text:
                offenders.append(str(path.relative_to(root)))
    assert offenders == []
