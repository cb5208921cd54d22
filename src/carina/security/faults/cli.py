"""``carina faults``: timing-fault injection into a DNN accelerator (SkyNet), simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Timing-fault injection into DNN accelerators (simulated).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
WeightsOpt = Annotated[Path, typer.Option("--weights", help="SkyNet dac.weights (HDF5).")]
ImagesOpt = Annotated[Path, typer.Option("--images", help="Folder of .jpg test images.")]


def _grid(text: str) -> list[float]:
    """``lo:hi:n`` (inclusive, n points) or a comma list."""
    from carina.core.errors import ConfigError

    try:
        if ":" in text:
            lo, hi, n = text.split(":")
            k = int(n)
            return [round(float(lo) + (float(hi) - float(lo)) * i / max(1, k - 1), 6) for i in range(k)]
        return [float(x) for x in text.split(",")]
    except ValueError as exc:
        raise ConfigError(f"grid {text!r} is not 'lo:hi:n' or a comma list", key="grid") from exc


def _images(folder: Path, count: int):  # type: ignore[no-untyped-def]
    import torch

    from carina.core.errors import ModelFormatError
    from carina.security.faults.skynet import load_image

    files = sorted(folder.glob("*.jpg"), key=lambda p: (len(p.stem), p.stem))[:count]
    if not files:
        raise ModelFormatError("no .jpg images", file=str(folder))
    return torch.stack([load_image(p) for p in files]), [p.name for p in files]


@app.command()
def sweep(
    weights: WeightsOpt,
    images: ImagesOpt,
    voltages: Annotated[str, typer.Option(help="Voltage grid 'lo:hi:n' or list (V).")] = "0.45:0.85:9",
    freqs: Annotated[str, typer.Option(help="Clock grid 'lo:hi:n' or list (MHz).")] = "150:300:7",
    window: Annotated[list[str] | None, typer.Option(help="'global' or 'local:<ms>@<start_ms>' (repeat).")] = None,
    intensity: Annotated[list[float] | None, typer.Option(help="Intensity multipliers (repeat).")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per point.")] = 2,
    count: Annotated[int, typer.Option("--count", help="Images used (first N).")] = 12,
    numeric: Annotated[str, typer.Option(help="fixed or float.")] = "fixed",
    heatmap_png: Annotated[Path | None, typer.Option("--heatmap", help="Write the V x f loss map (PNG).")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda[:N] (same results, bit for bit).")] = "cpu",
    batch: Annotated[int, typer.Option(help="Rows (point x seed x image) per forward.")] = 24,
    json_out: JsonOpt = False,
) -> None:
    """Sweep DVFS operating points; report loss, vulnerable pairs and detector rates (simulated)."""
    from carina.core.progress import emit_json, print_table, progress
    from carina.security.faults.campaign import SweepConfig, run_sweep
    from carina.security.faults.metrics import summarize
    from carina.security.faults.report import heatmap, to_json
    from carina.security.faults.skynet import load_skynet

    cfg = SweepConfig.from_dict(
        {"voltages": _grid(voltages), "freqs_mhz": _grid(freqs), "windows": window or ["global"],
         "intensities": intensity or [1.0], "seeds": seeds, "numeric": numeric, "device": device, "batch": batch}
    )  # fmt: skip
    x, _names = _images(images, count)
    total = len(cfg.voltages) * len(cfg.freqs_mhz) * len(cfg.windows) * len(cfg.intensities)
    with progress() as bar:
        task = bar.add_task("operating points", total=total)
        result = run_sweep(load_skynet(weights), x, cfg, on_point=lambda _: bar.advance(task))
    if heatmap_png is not None:
        heatmap(result, heatmap_png, window=cfg.windows[0], intensity=cfg.intensities[0])
    doc = to_json(result, cfg)
    if json_out:
        emit_json(doc)
        return
    rows = []
    for p in result.vulnerable(cfg.vulnerable_loss):
        s = summarize(p.ious)
        rows.append([p.voltage, p.freq_mhz, p.window, p.intensity, f"{s.loss:.3f}", f"{s.frac_below_half:.2f}"])
    print_table(rows, columns=["V", "MHz", "window", "intensity", "loss", "P(IoU<0.5)"],
                title=f"vulnerable operating points (simulated; loss >= {cfg.vulnerable_loss})")  # fmt: skip


@app.command()
def detect(
    weights: WeightsOpt,
    images: ImagesOpt,
    numeric: Annotated[str, typer.Option(help="fixed or float.")] = "fixed",
    count: Annotated[int, typer.Option("--count", help="Images used (first N).")] = 16,
    json_out: JsonOpt = False,
) -> None:
    """Fault-free boxes (640x360 pixels) of each image."""
    from carina.core.progress import emit_json, print_table
    from carina.security.faults.skynet import Numeric, SkyNet, decode_boxes, load_skynet

    x, names = _images(images, count)
    boxes = decode_boxes(SkyNet(load_skynet(weights), numeric=Numeric(numeric))(x)).tolist()
    rows = [
        {"image": n, "box": [round(v, 1) for v in b[:4]], "conf": round(b[4], 4)}
        for n, b in zip(names, boxes, strict=True)
    ]
    if json_out:
        emit_json({"numeric": numeric, "detections": rows})
    else:
        print_table(rows, columns=["image", "box", "conf"], title=f"SkyNet ({numeric})")
