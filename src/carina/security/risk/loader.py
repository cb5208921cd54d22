"""Load a risk model from YAML in either dialect (STRonG's or carina's).

A file whose top level has a ``carina:`` key is carina's dialect; anything else is read
as STRonG's. Every error is a :class:`~carina.core.errors.ModelFormatError` with the
file and line it concerns.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from carina.security.risk.carina_dialect import read_carina
from carina.security.risk.expand import ExpandConfig, expand
from carina.security.risk.model import Model, Spec
from carina.security.risk.source import read_documents
from carina.security.risk.strong_dialect import is_strong, read_strong

__all__ = ["load_model", "load_spec", "loads_model"]


def load_spec(path: str | Path) -> Spec:
    """Read ``path`` and its includes into an unexpanded :class:`Spec`."""
    files = read_documents(path)
    main = files[-1].data
    return read_strong(files) if is_strong(main) else read_carina(files)


def load_model(path: str | Path, config: ExpandConfig | None = None) -> Model:
    """Read, expand and check the model at ``path``."""
    return expand(load_spec(path), config)


def loads_model(text: str, *, name: str = "model.yml", config: ExpandConfig | None = None) -> Model:
    """Load a model from a YAML string (includes are not allowed to escape a temp dir)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text)
        model = load_model(path, config)
    model.files = [name]
    return model
