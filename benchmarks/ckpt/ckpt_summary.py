"""Print the key figures of the ckpt records in a folder (the device scripts' last step).

python benchmarks/ckpt/ckpt_summary.py OUT/ckpt _h200
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(root: Path, name: str) -> dict[str, Any] | None:
    path = root / f"{name}.json"
    return json.loads(path.read_text())["metrics"] if path.is_file() else None


def stall(m: dict[str, Any]) -> None:
    for label, run in m["sizes"].items():
        if "state_bytes" not in run:
            print(f"stall {label}: {run.get('skipped', 'not run')}")
            continue
        persist = run["state_bytes"] / run["disk_write_Bps"]
        print(f"stall {label}: state {run['state_bytes'] / 1e9:.2f} GB, step {run['step_s_median'] * 1e3:.1f} ms, "
              f"disk write {run['disk_write_Bps'] / 1e9:.2f} GB/s (persist {persist:.2f} s)")  # fmt: skip
        print(f"  {'method':16} {'block_s':>8} {'stall_s':>8} {'durable_s':>9} {'first_s':>8} {'host+GB':>8}")
        for name, r in run["methods"].items():
            if "stall_s_median" in r:
                mem = r.get("host_extra_GB", float("nan"))
                print(f"  {name:16} {r['blocking_s_median']:8.4f} {r['stall_s_median']:8.4f} "
                      f"{r['durable_s_median']:9.3f} {r['first_stall_s']:8.3f} {mem:8.2f}")  # fmt: skip
            else:
                print(f"  {name:16} {str(r.get('error') or r.get('skipped'))[:100]}")
    for g in m["goals"]:
        print(f"  goal {g['params']} {g['writer']}: torch.save/stall {g['torch_save_over_stall']} (>= 20), "
              f"stall/dcp.async {g['stall_over_dcp_async']} (<= 1), durable {g['durable_s']} s "
              f"(<= {g['durable_goal_s']}): {'met' if g['stall_goal_met'] else 'NOT met'}/"
              f"{'met' if g['durable_goal_met'] else 'NOT met'}")  # fmt: skip
    print(f"  best writer by stall: {m['best_writer']}")


def overhead(m: dict[str, Any]) -> None:
    print(f"overhead: persist {m['persist_s']:.2f} s, clean windows {[round(c, 2) for c in m['clean_s']]} s")
    print(f"  {'method':16} {'K':>4} {'interval_s':>10} {'overhead%':>9} {'drain_s':>7} goal")
    for r in m["summary"]:
        if "overhead_pct" in r:
            goal = "n/a" if r["goal_met"] is None else ("met" if r["goal_met"] else "NOT met")
            print(f"  {r['method']:16} {r['interval']:4d} {r['interval_s']:10.2f} {r['overhead_pct']:9.2f} "
                  f"{r['drain_s']:7.2f} {goal}")  # fmt: skip
        else:
            print(f"  {r['method']:16} {r.get('note', '')[:100]}")


def restore(m: dict[str, Any]) -> None:
    print(f"restore: state {m['state_bytes'] / 1e9:.2f} GB, disk read {m['disk_read_Bps'] / 1e9:.2f} GB/s "
          f"(ceiling {m['state_bytes'] / m['disk_read_Bps']:.2f} s)")  # fmt: skip
    for r in m["summary"]:
        print(f"  {r['method']:16} cold {r['cold_s_median']:7.3f} s  warm {r['warm_s_median']:7.3f} s  "
              f"bitwise {r['bitwise']}")  # fmt: skip


def main() -> None:
    root, suffix = Path(sys.argv[1]), sys.argv[2]
    for kind, show in (("stall", stall), ("overhead", overhead), ("restore", restore)):
        m = _load(root, f"ckpt_{kind}{suffix}")
        if m is None:
            print(f"{kind}: no record")
            continue
        try:
            show(m)
        except (KeyError, TypeError, ZeroDivisionError) as exc:  # a record cut short: say so, show the rest
            print(f"{kind}: incomplete record ({exc!r})")


if __name__ == "__main__":
    main()
