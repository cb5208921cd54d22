"""Campaign outputs: JSON document, vulnerable pairs, and the V x f heat map (PNG). All simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from carina.security.faults.metrics import summarize
from carina.security.faults.sweep import SweepConfig, SweepResult

__all__ = ["heatmap", "to_json"]


def to_json(result: SweepResult, cfg: SweepConfig) -> dict[str, Any]:
    """The campaign as a JSON-compatible dict (every number labelled simulated)."""
    vulnerable = result.vulnerable(cfg.vulnerable_loss)
    return {
        "basis": "simulated",
        "config": cfg.to_dict(),
        "seconds": result.seconds,
        "forwards": result.forwards,
        "detector_overhead_macs": result.overheads,
        "vulnerable_pairs": sorted(
            {(p.voltage, p.freq_mhz) for p in vulnerable if p.window == "global" and p.intensity == 1.0}
        ),
        "points": [p.to_dict() for p in result.points],
    }


def heatmap(result: SweepResult, path: str | Path, *, window: str = "global", intensity: float = 1.0) -> Path:
    """Detection-accuracy loss over the V x f grid for one window and intensity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pts = [p for p in result.points if p.window == window and p.intensity == intensity]
    vs = sorted({p.voltage for p in pts})
    fs = sorted({p.freq_mhz for p in pts})
    grid = np.full((len(vs), len(fs)), np.nan)
    for p in pts:
        grid[vs.index(p.voltage), fs.index(p.freq_mhz)] = summarize(p.ious).loss
    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=100)
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="inferno", vmin=0.0, vmax=1.0,
                   extent=(fs[0], fs[-1], vs[0], vs[-1]))  # fmt: skip
    ax.set_xlabel("accelerator clock (MHz)")
    ax.set_ylabel("core voltage (V)")
    ax.set_title(f"SkyNet detection-accuracy loss, {window}, x{intensity:g} (simulated)")
    fig.colorbar(im, ax=ax, label="1 - mean IoU vs fault-free")
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out
