import pickle

import pytest

from carina import errors
from carina.core import errors as core_errors

TREE = {
    "ConfigError": ("CarinaError", ValueError),
    "BackendUnavailable": ("CarinaError",),
    "IOEngineError": ("CarinaError",),
    "ShortRead": ("IOEngineError",),
    "AlignmentError": ("IOEngineError",),
    "DeviceFull": ("IOEngineError",),
    "CapacityError": ("CarinaError",),
    "CheckpointError": ("CarinaError",),
    "CorruptCheckpoint": ("CheckpointError",),
    "ProvisioningError": ("CarinaError",),
    "StorageProtocolError": ("CarinaError",),
    "ModelFormatError": ("CarinaError", ValueError),
    "ValidationFailed": ("CarinaError",),
}


@pytest.mark.parametrize("name", sorted(TREE))
def test_tree_shape(name):
    cls = getattr(errors, name)
    for parent in TREE[name]:
        parent_cls = getattr(errors, parent) if isinstance(parent, str) else parent
        assert issubclass(cls, parent_cls)


def test_every_class_is_drawn_in_the_docstring():
    doc = core_errors.__doc__
    for name in core_errors.__all__:
        assert name in doc, name


def test_public_facade_matches_core():
    assert errors.__all__ == core_errors.__all__
    assert all(getattr(errors, n) is getattr(core_errors, n) for n in errors.__all__)


def test_context_is_in_message_and_survives_pickling():
    exc = errors.ShortRead("short read", path="/x", offset=4096, expected=10, got=3)
    assert str(exc) == "short read (path='/x', offset=4096, expected=10, got=3)"
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is errors.ShortRead
    assert back.context == exc.context and str(back) == str(exc)


def test_none_context_is_dropped():
    assert str(errors.ConfigError("bad", key=None)) == "bad"
