"""How large a carina.offload checkpoint run this machine can hold, before building anything.

A run holds carina.offload's host state (float32 masters, AdamW moments,
gradients, buffers: OFFLOAD_HOST_B_PER_PARAM bytes per parameter, from the
largest H200 offload record) and, while one method saves, that method's copies:

- ``carina-*``: two staging arenas of the state + 1/16 each, in /dev/shm for
  ``process``; two checkpoints on disk (the untimed one until the timed one commits);
- ``dcp.async_save`` / ``dcp.async_process``: one staged copy of the state, one checkpoint
  on disk (the benchmark removes the previous one before each save);
- ``torch.save``: its serialisation buffers (a third of the state in
  ckpt_offload_h200_s6), one checkpoint on disk, two unless it is ``--cold``.

Methods run one after another, so the run needs the base plus the largest of them.
:func:`fit_model` takes a preset and at most ``max_layers`` of its layers, and
keeps the most layers whose needs fit within 90 % of the free host memory and
disk and 95 % of free /dev/shm measured now.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from carina.core.errors import CapacityError

#: offload_s2_7b16l_8k.json (H200, llama2-7b at 16 layers): process RSS peak 84.4 GB at 3.50 B parameters.
OFFLOAD_HOST_B_PER_PARAM = 24.1
STATE_B_PER_PARAM = 12  # float32 masters + two AdamW moments: what every method persists
ARENAS = 2 * (1 + 1 / 16)  # carina's A/B staging arenas, each the state + 1/16


@dataclass(kw_only=True)
class Fit:
    """One shape's needs against what is free (bytes)."""

    preset: str
    layers: int
    params: int
    state_bytes: int
    need_host: int
    need_disk: int
    need_shm: int
    free_host: int
    free_disk: int
    free_shm: int

    @property
    def fits(self) -> bool:
        """Within 90 % of free host memory and disk, 95 % of free /dev/shm."""
        return (self.need_host <= 0.9 * self.free_host and self.need_disk <= 0.9 * self.free_disk
                and self.need_shm <= 0.95 * self.free_shm)  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """The record's view: every field in GB (counts as they are) and whether it fits."""
        out: dict[str, Any] = {k: (round(v / 1e9, 2) if k.startswith(("need", "free", "state")) else v)
                               for k, v in asdict(self).items()}  # fmt: skip
        return {**out, "fits": self.fits}


def needs(params: int, methods: list[str], cold: tuple[str, ...]) -> tuple[int, int, int]:
    """(host, disk, /dev/shm) bytes a run of ``methods`` over ``params`` parameters needs at its peak."""
    state = STATE_B_PER_PARAM * params
    host = disk = shm = 0
    for m in methods:
        if m.startswith("carina-"):
            extra, on_disk = ARENAS * state, 2 * state
            shm = max(shm, int(ARENAS * state) if m == "carina-process" else 0)
        elif m.startswith("dcp."):
            extra, on_disk = state, state
        else:
            extra, on_disk = state / 3, state if m in cold else 2 * state
        host, disk = max(host, int(extra)), max(disk, int(on_disk))
    return int(OFFLOAD_HOST_B_PER_PARAM * params) + host, disk, shm


def free_space(root: Path) -> tuple[int, int, int]:
    """Free host memory (available), disk under ``root`` and /dev/shm, in bytes."""
    import psutil

    root.mkdir(parents=True, exist_ok=True)
    shm = shutil.disk_usage("/dev/shm").free if Path("/dev/shm").is_dir() else 0
    return psutil.virtual_memory().available, shutil.disk_usage(root).free, shm


def fit_model(preset: str, max_layers: int, methods: list[str], cold: tuple[str, ...], root: Path,
              free: tuple[int, int, int] | None = None) -> tuple[str, Fit]:  # fmt: skip
    """A model JSON under ``root`` with the most layers (<= ``max_layers``) that fit, and its Fit.

    Raises:
        CapacityError: Not even one layer fits (the message names the needs and the free space).
        ConfigError: Unknown preset.
    """
    from carina.offload.models import PRESETS, model_config, param_count

    model_config(preset)  # names an unknown preset
    free = free or free_space(root)
    fit = None
    for layers in range(max_layers, 0, -1):
        params = param_count(model_config(preset, num_hidden_layers=layers))
        fit = Fit(preset=preset, layers=layers, params=params, state_bytes=STATE_B_PER_PARAM * params,
                  **dict(zip(("need_host", "need_disk", "need_shm"), needs(params, methods, cold), strict=True)),
                  **dict(zip(("free_host", "free_disk", "free_shm"), free, strict=True)))  # fmt: skip
        if fit.fits:
            break
    if fit is None or not fit.fits:
        raise CapacityError(f"no {preset} shape of 1..{max_layers} layers fits this machine for {methods}: "
                            f"{fit.summary() if fit else 'no layers'}")  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{preset}_{fit.layers}l.json"
    path.write_text(json.dumps({**PRESETS[preset], "num_hidden_layers": fit.layers}))
    return str(path), fit
