"""The ckpt_stall record: per model size, every method's stall, time until durable and peak host memory.

Figures (per size, per carina writer): ``stall_per_ckpt_<writer>_<size>`` against
every peer; ``time_to_durable_<writer>_<size>`` against state bytes / the disk
write bandwidth measured in the same run; ``host_extra_<writer>_<size>`` (peak
host memory above the trainer's resident set before the method) against one host
copy of the state. ``metrics.goals`` checks the issue's goals per writer and
size; ``metrics.best_writer`` names the carina writer with the lowest stall.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from carina.core.bench import Figure, machine_label, make_record, results_dir, write_record

_ENV: list[Any] = []
_KEYS = ("blocking_s_median", "interference_s_median", "stall_s_median", "durable_s_median", "first_stall_s")
_MEM = ("host_extra_GB", "host_peak_GB", "children_peak_GB")


def env() -> Any:
    """This machine's environment (carina doctor), collected once per run."""
    if not _ENV:
        from carina.core.doctor import collect
        from carina.core.progress import to_jsonable

        _ENV.append(to_jsonable(collect(paths=())))
    return _ENV[0]


def record_path(name: str) -> Path:
    """Where ``write_record`` puts record ``name`` on this machine."""
    return results_dir(machine_label(env())) / f"{name}.json"


def ok(v: dict[str, Any]) -> bool:
    """Whether a method produced measurements (not skipped or failed)."""
    return "stall_s_median" in v


def goals(label: str, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals for each measured carina writer of one size."""
    if "state_bytes" not in run:
        return []
    done = {k: v for k, v in run["methods"].items() if ok(v)}
    ts = done.get("torch.save", {}).get("stall_s_median")
    asyncs = [done[k]["stall_s_median"] for k in ("dcp.async_save", "dcp.async_process") if k in done]
    da = min(asyncs) if asyncs else None  # the better of DCP's two async modes
    limit = 1.2 * run["state_bytes"] / run["disk_write_Bps"] + 0.5
    out = []
    for name, v in done.items():
        if not name.startswith("carina-"):
            continue
        stall = v["stall_s_median"]
        x_ts = ts / stall if ts and stall > 0 else None
        out.append({"params": label, "writer": name, "stall_s": round(stall, 4),
                    "torch_save_over_stall": None if x_ts is None else round(x_ts, 2),
                    "stall_over_dcp_async": None if not da else round(stall / da, 3),
                    "stall_goal_met": bool(x_ts and x_ts >= 20 and da and stall <= da),
                    "durable_s": round(v["durable_s_median"], 3), "durable_goal_s": round(limit, 3),
                    "durable_goal_met": v["durable_s_median"] <= limit})  # fmt: skip
    return out


def figures(label: str, run: dict[str, Any]) -> list[Figure]:
    """Per carina writer of one size: stall, time until durable and host memory, with peers and ceilings."""
    if "state_bytes" not in run:
        return []
    done = {k: v for k, v in run["methods"].items() if ok(v)}
    peers = {k: v for k, v in done.items() if not k.startswith("carina-")}
    nbytes, src = run["state_bytes"], run["disk_ceiling_source"]
    out = []
    for name, r in done.items():
        if not name.startswith("carina-"):
            continue
        w = f"{name.removeprefix('carina-')}_{label}"
        out.append(Figure(name=f"stall_per_ckpt_{w}", value=r["stall_s_median"], unit="s", higher_is_better=False,
                          peers={p: v["stall_s_median"] for p, v in peers.items()}))  # fmt: skip
        out.append(Figure(name=f"time_to_durable_{w}", value=r["durable_s_median"], unit="s", higher_is_better=False,
                          ceiling=nbytes / run["disk_write_Bps"], ceiling_source=f"state bytes / {src}",
                          peers={p: v["durable_s_median"] for p, v in peers.items()}))  # fmt: skip
        if "host_extra_GB" in r:
            out.append(Figure(name=f"host_extra_{w}", value=max(r["host_extra_GB"], 1e-6), unit="GB",
                              higher_is_better=False, ceiling=nbytes / 1e9,
                              ceiling_source="one host copy of the state (staging off the device needs it)",
                              peers={p: max(v.get("host_extra_GB", 0), 1e-6) for p, v in peers.items()}))  # fmt: skip
    return out


class StallRecord:
    """Accumulates sizes and rewrites the record after every change."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.name = args.name or f"ckpt_stall_{args.device}"
        self.sizes: dict[str, dict[str, Any]] = {}
        path = record_path(self.name)
        if args.append and path.is_file():
            old = json.loads(path.read_text())["metrics"].get("sizes", {})
            self.sizes.update(old)

    def add(self, label: str, run: dict[str, Any]) -> None:
        """Start size ``label`` (replacing an earlier run of it) and write."""
        run["command"] = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self.sizes.pop(label, None)
        self.sizes[label] = run
        self.write()

    def write(self) -> None:
        """Write the record with every size so far."""
        a = self.args
        figs = [f for label, run in self.sizes.items() for f in figures(label, run)]
        summary = []
        for label, run in self.sizes.items():
            if "skipped" in run:
                summary.append({"params": label, "method": "-", "note": run["skipped"]})
            for k, v in run.get("methods", {}).items():
                row = {"params": label, "method": k}
                if ok(v):
                    row.update({c: round(v[c], 4) for c in (*_KEYS, *_MEM) if c in v})
                else:
                    row["note"] = str(v.get("error") or v.get("skipped") or "")[:300]
                summary.append(row)
        best = {}
        for label, run in self.sizes.items():
            methods = run.get("methods", {})
            ours = {k: v["stall_s_median"] for k, v in methods.items() if k.startswith("carina-") and ok(v)}
            if ours:
                best[label] = min(ours, key=lambda k: ours[k]).removeprefix("carina-")
        metrics = {"summary": summary, "goals": [g for lb, r in self.sizes.items() for g in goals(lb, r)],
                   "best_writer": best, "sizes": self.sizes}  # fmt: skip
        keys = ("params", "model", "device", "reps", "min_steps", "writers", "peers", "threads", "budget_s",
                "save_deadline_s", "append")  # fmt: skip
        notes = (f"{a.model} model, fp32 params + AdamW moments, on {a.device}; stall = blocking + sum(step - median "
                 "of the clean steps just before it) while the save is in flight; medians exclude the first save "
                 "(first_stall_s). host_extra_GB = peak (trainer RSS + writer children's private pages, sampled "
                 "every 20 ms) - trainer RSS before the method. The command names every run that made a size (each "
                 "size's own is in metrics.sizes): --append keeps sizes of earlier runs. Written after each setup "
                 "and method: methods absent from metrics.summary were not reached.")  # fmt: skip
        commands = " && ".join(dict.fromkeys(r["command"] for r in self.sizes.values() if "command" in r))
        rec = make_record(name=self.name, figures=figs, config={k: getattr(a, k) for k in keys}, metrics=metrics,
                          notes=notes, environment=env(), command=commands or None)  # fmt: skip
        print(write_record(rec), file=sys.stderr, flush=True)
