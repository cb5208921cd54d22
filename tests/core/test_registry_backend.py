import pytest

from carina.core.backend import Backend, select_backend
from carina.core.registry import Registry
from carina.errors import BackendUnavailable, ConfigError
from carina.testing.conformance import BackendTests, NullBackend


def test_lazy_load_and_errors():
    reg = Registry("test.thing")
    reg.register("json", "json:dumps")
    reg.register("ghost", "carina_no_such_module:X", extra="gpu")
    assert reg.names() == ["json", "ghost"]
    import json

    assert reg.load("json") is json.dumps
    with pytest.raises(BackendUnavailable, match=r"pip install 'carina\[gpu\]'"):
        reg.load("ghost")
    with pytest.raises(ConfigError, match="known: json, ghost"):
        reg.load("nope")
    with pytest.raises(ConfigError):
        reg.register("json", "pickle:dumps")
    with pytest.raises(ConfigError):
        reg.register("bad", "no_colon")


class Picky(Backend):
    name = "picky"

    def unsupported_reasons(self, request=None):
        return [] if request == "ok" else [f"cannot serve {request!r}"]


def test_select_explains_skips():
    sel = select_backend([Picky(), NullBackend()], "other")
    assert sel.backend.name == "null"
    assert sel.skipped == {"picky": ["cannot serve 'other'"]}
    assert "skipped picky" in sel.explain()
    with pytest.raises(BackendUnavailable, match="picky: cannot serve"):
        select_backend([Picky()], "other")


class TestNullBackend(BackendTests):
    @pytest.fixture
    def backend(self):
        return NullBackend()


class TestPickyBackend(BackendTests):
    request = "ok"

    @pytest.fixture
    def backend(self):
        return Picky()
