"""Meta-tests of the test suite's own layout."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_names_are_unique():
    # pytest imports test modules by basename (rootdir-relative, no packages): two equal names collide.
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []


SUBSYSTEMS = [
    "core",
    "io",
    "memory",
    "offload",
    "offload/disagg",
    "gnn",
    "gnn/placement",
    "ckpt",
    "infra/cluster",
    "infra/provision",
    "infra/storage",
    "security/risk",
    "security/introspect",
    "security/tee",
    "security/faults",
]


def test_every_subsystem_has_tests_at_its_mirrored_path():
    missing = []
    for sub in SUBSYSTEMS:
        path = TESTS / sub
        name = path.name
        if not path.is_dir() and not any(path.parent.glob(f"test_{name}*.py")):
            missing.append(sub)
    assert missing == []


def test_every_lazily_exported_name_resolves():
    """A package that hands names on lazily (``__getattr__`` over ``__all__``) gives every one of them.

    (When ``NbdServer`` moved to ``listener.py`` in session 11, the storage package still sent it to
    ``server.py``; only this import would have noticed.)
    """
    import importlib
    import pkgutil

    import carina

    checked = 0
    for info in pkgutil.walk_packages(carina.__path__, "carina."):
        if not info.ispkg:
            continue
        mod = importlib.import_module(info.name)
        if "__getattr__" not in vars(mod):
            continue
        for name in getattr(mod, "__all__", []):
            assert getattr(mod, name) is not None, f"{info.name}.{name}"
            checked += 1
    assert checked > 0
