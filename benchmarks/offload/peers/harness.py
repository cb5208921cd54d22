"""Train carina and every peer on the same model, tokens and budget; record, tabulate, plot.

One command runs every system as its own process on each configuration and writes one JSON
record per (system, configuration), ``offload_peers_summary.md`` and ``offload_peers.png``
(tokens/s per system per configuration, the ideal and the roofline marked)::

    python benchmarks/offload/peers/harness.py --preset h100     # 7B / 24 GB / 8k-32k-128k tokens
    python benchmarks/offload/peers/harness.py --preset ci       # a tiny model on the CPU

Each system's records (and the table and plot, so far) are written as soon as that system finishes, and
each run prints one line with its outcome and wall time, so a harness stopped by an outer time limit keeps
what it measured. The ideal runs after the systems of its configuration (before them in presets with
``ideal_first``: its plain run is every system's loss reference); records written before it carry no
ideal and are rewritten with it. ``--budget`` bounds the whole run: a system left without time is a
``not run`` row with that reason.

Configurations are the presets of ``presets.py``: a step's micro-batch split (gradient accumulation) and a
host budget (the spill configuration) are part of a configuration, the same for every system and the ideal
(which has no host budget). With ``--nvme-path`` each system spills into a folder of its own, removed after it.
A system that failed at the configuration in a committed record the preset names (``known``) is a
``not run`` row naming that record (earlier.py); a row whose reason is known without running it is written
without a process.

Ideal: plain PyTorch with unlimited memory; when the model does not fit, its step time is
extrapolated from 4- and 8-layer truncations (time = a + b·layers), and plain PyTorch uncapped with
activation checkpointing (the same math, never the ideal) is every system's loss reference. Roofline: the step cannot
be faster than the ideal's compute, nor than moving the bf16 weights to the GPU twice (forward
and backward) and the bf16 gradients back once over the measured PCIe bandwidth, nor than the
measured CPU AdamW throughput over all parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from earlier import known_row  # noqa: E402
from presets import PRESETS, base_spec  # noqa: E402
from report import REFERENCE_CHECKPOINTED, REFERENCE_PLAIN  # noqa: E402
from systems import static_result  # noqa: E402
from workload import SHAPES, RunSpec, n_params  # noqa: E402


def run_one(spec: RunSpec, timeout: float, *, cache: bool = True) -> dict[str, Any]:
    """``spec`` in a process of its own; ``cache=False``: without the weights cache (a model used once)."""
    env = None if cache else {k: v for k, v in os.environ.items() if k != "PEERS_WEIGHTS_DIR"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(HERE / "run_system.py"), "--spec", json.dumps(asdict(spec)), "--out", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"spec": asdict(spec), "status": "failed", "reason": f"timed out after {timeout:g} s"}
        if not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"spec": asdict(spec), "status": "failed", "reason": f"exit {proc.returncode}: {tail[0][:300]}"}
        result = dict(json.loads(out.read_text()))
        if result.get("status") != "ok":  # keep the child's last words with the failed row
            result["stderr_tail"] = (proc.stderr or "").strip().splitlines()[-40:]
        return result


def calibrate(timeout: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "calib.json"
        subprocess.run(
            [sys.executable, str(HERE / "run_system.py"), "--calibrate", "--out", str(out)], check=True, timeout=timeout
        )
        return dict(json.loads(out.read_text()))


def ideal_step_s(base: RunSpec, timeout: float) -> tuple[float | None, str, dict[str, Any] | None, str]:
    """Unlimited-memory step time: measured when plain fits uncapped, else extrapolated from 4 and 8 layers.

    The last two values are the loss reference of every system and what it is: the uncapped plain run
    when it ran, else plain uncapped with activation checkpointing (same weights, tokens and math; its
    time is never the ideal), else None.
    """
    base = replace(base, host_budget_gib=None, nvme_path=None)  # unlimited memory: no host budget, no spill
    full = run_one(replace(base, system="plain", gpu_budget_gib=None), timeout)
    if full["status"] == "ok":
        how = "measured (plain PyTorch, uncapped)"
        return base.tokens_per_step / full["tokens_per_s"], how, full, REFERENCE_PLAIN
    _say(f"plain uncapped: {_outcome(full)}; the loss reference is plain with activation checkpointing")
    ref = run_one(replace(base, system="plain_checkpointed", gpu_budget_gib=None), timeout)
    reference, ref_how = (ref, REFERENCE_CHECKPOINTED) if ref["status"] == "ok" else (None, _outcome(ref)[:200])
    points = []
    for layers in (4, 8):
        res = run_one(replace(base, system="plain", gpu_budget_gib=None, layers=layers), timeout, cache=False)
        if res["status"] != "ok":
            return None, f"plain PyTorch could not run {layers} layers: {res['reason']}", reference, ref_how
        points.append((layers, base.tokens_per_step / res["tokens_per_s"]))
    (l4, t4), (l8, t8) = points
    slope = (t8 - t4) / (l8 - l4)
    layers = base.layers or SHAPES[base.shape]["num_hidden_layers"]
    how = f"extrapolated from {l4}/{l8}-layer truncations ({full['reason'][:80]})"
    return t4 + slope * (layers - l4), how, reference, ref_how


def roofline_step_s(spec: RunSpec, ideal_s: float | None, calib: dict[str, float]) -> float | None:
    if ideal_s is None or "h2d_gbps" not in calib:
        return None
    n = n_params(spec)
    return max(
        ideal_s,
        4 * n / (calib["h2d_gbps"] * 1e9),
        2 * n / (calib["d2h_gbps"] * 1e9),
        n / calib["cpu_adamw_params_per_s"],
    )


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--systems", nargs="*", help="override the preset's systems")
    parser.add_argument("--nvme-path", default=None, help="spill directory (adds ZeRO-Infinity and carina+nvme)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<machine>)")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole harness (each run gets "
        "at most what is left; a system with under 20 s left is a 'not run' row with that reason)",
    )
    parser.add_argument("--tag", default="", help="prefix of every output's name (offload_peers_<tag>_...)")
    parser.add_argument("--skip-ideal", action="store_true", help="no ideal run (a diagnostic of the systems alone)")
    parser.add_argument(
        "--rerun-known", action="store_true", help="run the systems the preset knows failed here (earlier.py)"
    )
    return parser.parse_args()


def main() -> None:
    args = _args()
    preset = PRESETS[args.preset]
    systems = args.systems or list(preset["systems"])
    if preset.get("nvme") and not args.nvme_path:
        from carina.core.errors import ConfigError

        raise ConfigError(f"preset {args.preset} spills to NVMe: give --nvme-path", key="nvme_path")
    if args.nvme_path and "deepspeed_zero_infinity" not in systems:
        systems.append("deepspeed_zero_infinity")
    command = " ".join(["python", *sys.argv])
    t0 = time.perf_counter()
    calib = calibrate(args.timeout) if preset.get("calibrate", True) else {}  # the roofline's inputs
    _say(f"calibrate: {json.dumps({k: round(v, 2) for k, v in calib.items()})} in {time.perf_counter() - t0:.0f} s")
    rows: list[dict[str, Any]] = []
    for tokens in preset["tokens"]:
        base = base_spec(preset, tokens, args.nvme_path)
        row: dict[str, Any] = {
            "tokens": tokens,
            "tag": args.tag,
            "base": asdict(base),
            "ideal_s": None,
            "ideal_how": "not measured (the harness stopped before the ideal ran)",
            "roofline_s": None,
            "reference": None,  # the uncapped plain run (the ideal's, or checkpointed), once it ran
            "reference_how": "",
            "results": {},
        }
        rows.append(row)
        _run_configuration(rows, base, systems, calib, args, t0, command)
        for path in _write(rows, calib, command, args.out):
            print(path)


def _run_configuration(
    rows: list[dict[str, Any]],
    base: RunSpec,
    systems: list[str],
    calib: dict[str, float],
    args: argparse.Namespace,
    t0: float,
    command: str,
) -> None:
    """Every system on the last row's configuration, and the ideal first or last as the preset says."""
    row, ideal_first = rows[-1], bool(PRESETS[args.preset].get("ideal_first"))
    if ideal_first and not args.skip_ideal:
        _run_ideal(row, base, calib, _time_left(args, t0))
    for system in systems:
        start = time.perf_counter()
        limit = _time_left(args, t0)
        spec = _system_spec(base, system, PRESETS[args.preset])
        known = PRESETS[args.preset].get("known", {}).get(system)
        earlier = None if args.rerun_known or known is None else known_row(asdict(spec), known)
        static = static_result(spec)  # a row that needs no process (the spill budget, torchao's accumulation)
        if earlier is not None:
            result = earlier
        elif static is not None:
            result = json.loads(static.to_json())
        elif limit < 20:
            why = f"not run: {limit:.0f} s left of the harness's {args.budget:g} s budget"
            result = {"spec": asdict(spec), "status": "not run", "reason": why}
        else:
            result = _run_system(spec, limit)
        row["results"][system] = result
        _say(f"{system} {row['tokens']} tokens: {_outcome(result)} in {time.perf_counter() - start:.0f} s")
        _write(rows, calib, command, args.out)
    if args.skip_ideal:
        row["ideal_how"] = "not measured (--skip-ideal)"
    elif not ideal_first and _time_left(args, t0) >= 20:
        _run_ideal(row, base, calib, _time_left(args, t0))


def _system_spec(base: RunSpec, system: str, preset: dict[str, Any]) -> RunSpec:
    """``base`` for ``system``, with the GPU cap the preset gives that system (``system_budget``), if any."""
    spec = replace(base, system=system)
    if system in preset.get("system_budget", {}):
        spec = replace(spec, gpu_budget_gib=preset["system_budget"][system])
    return spec


def _run_system(spec: RunSpec, timeout: float) -> dict[str, Any]:
    """One system's run; with a spill directory, in a subdirectory of its own, removed afterwards.

    A system's spill files (carina's tier, DeepSpeed's swap folders) never take the next one's disk.
    """
    if not spec.nvme_path:
        return run_one(spec, timeout)
    import shutil

    own = Path(spec.nvme_path) / f"peers-{spec.system}"
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir(parents=True)
    try:
        return run_one(replace(spec, nvme_path=str(own)), timeout)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _time_left(args: argparse.Namespace, t0: float) -> float:
    """Seconds the next run may take: the per-run limit, within what is left of the harness's budget."""
    if args.budget is None:
        return float(args.timeout)
    return float(min(args.timeout, args.budget - (time.perf_counter() - t0) - 5))


def _run_ideal(row: dict[str, Any], base: RunSpec, calib: dict[str, float], timeout: float) -> None:
    """Measure the ideal (and the loss reference) of ``row`` in place."""
    start = time.perf_counter()
    row["ideal_s"], row["ideal_how"], row["reference"], row["reference_how"] = ideal_step_s(base, timeout)
    row["roofline_s"] = roofline_step_s(base, row["ideal_s"], calib)
    ideal = f"{row['tokens'] / row['ideal_s']:.0f} tokens/s" if row["ideal_s"] else "none"
    _say(f"ideal {row['tokens']} tokens: {ideal} ({row['ideal_how']}) in {time.perf_counter() - start:.0f} s")


def _say(line: str) -> None:
    print(f"[harness] {line}", flush=True)


def _outcome(result: dict[str, Any]) -> str:
    if result["status"] == "ok":
        return f"ok {result['tokens_per_s']:.0f} tokens/s, steps {[round(t, 3) for t in result['step_s']]}"
    return f"{result['status']}: {result.get('reason', '')[:200]}"


def _write(rows: list[dict[str, Any]], calib: dict[str, float], command: str, out: Path | None) -> list[Path]:
    """Records, table and plot of everything measured so far (rewritten as more finishes)."""
    from report import write_outputs

    return write_outputs(rows, calib, command=command, out=out)


if __name__ == "__main__":
    main()
