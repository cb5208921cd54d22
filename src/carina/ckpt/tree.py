"""Split a training state into a JSON tree of small values plus a flat list of tensors.

Checkpoints keep the small state (counters, hyper-parameters, RNG states, data
position) as JSON inside the manifest and the tensors in the data file. The tree
keeps what JSON alone loses, so a round trip gives back the same Python types::

    tree, tensors = flatten({"step": 3, "rng": random.getstate(), "w": torch.ones(2)})
    # tree == {"step": 3, "rng": {"__tuple__": [...]}, "w": {"__tensor__": "w"}}
    state = unflatten(tree, {"w": tensor})

Tags: ``__tensor__`` (torch tensor), ``__ndarray__`` (numpy array, stored as a
tensor), ``__tuple__``, ``__dict__`` (a dict with non-string keys, as pairs),
``__bytes__`` (hex), ``__float__`` (non-finite floats as text).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from carina.core.errors import CheckpointError, CorruptCheckpoint

__all__ = ["flatten", "unflatten"]

_TAGS = ("__tensor__", "__ndarray__", "__tuple__", "__dict__", "__bytes__", "__float__")


def flatten(state: Any, prefix: str = "", chunks: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """Return ``(tree, tensors)``; tensor names are the ``/``-joined paths to them.

    A DTensor contributes its local piece to ``tensors``; when ``chunks`` is
    given, its :class:`carina.ckpt.reshard.Chunk` (global shape, offset,
    placement) is stored there under the same name.

    Raises:
        CheckpointError: A value of a type that cannot be checkpointed, named by path.
    """
    tensors: dict[str, Any] = {}
    tree = _flatten(state, prefix, tensors, {} if chunks is None else chunks)
    return tree, tensors


def _flatten(value: Any, path: str, tensors: dict[str, Any], chunks: dict[str, Any]) -> Any:
    import numpy as np

    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if _is_tensor(value):
        from carina.ckpt.reshard import chunk_of

        chunk = chunk_of(value, path)
        tensors[path] = value.detach() if chunk is None else chunk.local
        if chunk is not None:
            chunks[path] = chunk
        return {"__tensor__": path}
    if isinstance(value, np.ndarray):
        import torch

        tensors[path] = torch.from_numpy(np.ascontiguousarray(value))
        return {"__ndarray__": path}
    if isinstance(value, np.generic):
        return _flatten(value.item(), path, tensors, chunks)
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, tuple):
        return {"__tuple__": [_flatten(v, _join(path, i), tensors, chunks) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_flatten(v, _join(path, i), tensors, chunks) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and k not in _TAGS for k in value):
            return {k: _flatten(v, _join(path, k), tensors, chunks) for k, v in value.items()}
        return {
            "__dict__": [
                [_flatten(k, _join(path, f"#{i}"), tensors, chunks), _flatten(v, _join(path, k), tensors, chunks)]
                for i, (k, v) in enumerate(value.items())
            ]
        }
    raise CheckpointError(f"cannot checkpoint a value of type {type(value).__name__}", key=path or "<root>")


def _join(path: str, key: object) -> str:
    return f"{path}/{key}" if path else str(key)


def _is_tensor(value: Any) -> bool:
    torch = _torch_if_loaded()
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_if_loaded() -> Any:
    import sys

    return sys.modules.get("torch")


def unflatten(tree: Any, tensors: Mapping[str, Any]) -> Any:
    """Inverse of :func:`flatten`.

    Raises:
        CorruptCheckpoint: The tree names a tensor that is not there or has a bad tag.
    """
    if isinstance(tree, list):
        return [unflatten(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        ((key, arg),) = tree.items()
        if key in _TAGS:
            return _untag(key, arg, tensors)
    return {k: unflatten(v, tensors) for k, v in tree.items()}


def _untag(key: str, arg: Any, tensors: Mapping[str, Any]) -> Any:
    if key in ("__tensor__", "__ndarray__"):
        if not isinstance(arg, str) or arg not in tensors:
            raise CorruptCheckpoint(f"state names tensor {arg!r} that the checkpoint lacks", key=str(arg))
        return tensors[arg] if key == "__tensor__" else tensors[arg].numpy()
    if key == "__tuple__" and isinstance(arg, list):
        return tuple(unflatten(v, tensors) for v in arg)
    if key == "__dict__" and isinstance(arg, list):
        if not all(isinstance(p, list) and len(p) == 2 for p in arg):
            raise CorruptCheckpoint("malformed __dict__ entry in checkpoint state", key=key)
        return {_hashable(unflatten(k, tensors)): unflatten(v, tensors) for k, v in arg}
    if key == "__bytes__" and isinstance(arg, str):
        try:
            return bytes.fromhex(arg)
        except ValueError as exc:
            raise CorruptCheckpoint("malformed __bytes__ value in checkpoint state", key=key) from exc
    if key == "__float__" and arg in ("inf", "-inf", "nan"):
        return float(arg)
    raise CorruptCheckpoint(f"malformed {key} value in checkpoint state", key=key)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError as exc:
        raise CorruptCheckpoint("checkpoint state has an unhashable dict key", key=repr(value)) from exc
    return value
