"""h100_s2.sh's preflight: the plan of a BUDGET against the phases' typical H200 durations, checked before a call.

Session 9 lost device time to three such calls (the combinations below); the script now refuses them.
"""

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "offload" / "h100_s2.sh"
RESULTS = REPO / "benchmarks" / "results" / "h200"
LINE = re.compile(r"^== plan (\w+) +at \+ *(\d+) s: timeout +(\d+) s, minimum +(\d+) s, ([^:]+): (.+)$", re.M)
#: The session 9 calls that lost their phases: (environment, the phase, its verdict, the BUDGET it needs).
FAILED = [
    ({"PHASES": "ideal carina_8k", "BUDGET": "110"}, "carina_8k", "skipped (timeout 39 s < its minimum 60 s)", 142),
    ({"HEAD_CHUNK": "4096", "PHASES": "carina_32k", "BUDGET": "100"}, "carina_32k", "cut short", 114),
    # the short spill: 8 of the 32 layers, its cap raised past the 105 s its 145 s retry was given
    (
        {"PHASES": "spill_8k", "SPILL_LAYERS": "8", "SPILL_BLOCKS": "3", "SPILL_CAP": "120", "BUDGET": "100"},
        "spill_8k",
        "cut short (timeout 60 s < its typical 107 s)",
        147,
    ),
]


def _run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}  # no DRY_RUN/FORCE/... leaks in
    return subprocess.run(["bash", str(script), *args], cwd=REPO, env={**base, **env}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def _plan(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    keys = ("at", "timeout", "minimum", "typical", "verdict")
    return {m[0]: dict(zip(keys, m[1:], strict=True)) for m in LINE.findall(proc.stdout)}


def _smallest(proc: subprocess.CompletedProcess[str]) -> int:
    return int(re.search(r"typical duration: (\d+) s \(this one", proc.stdout)[1])


@pytest.mark.parametrize(("env", "phase", "verdict", "need"), FAILED)
def test_session9_failed_calls_are_planned_short_and_refused(tmp_path, env, phase, verdict, need):
    dry = _run(SCRIPT, DRY_RUN="1", **env)
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert _plan(dry)[phase]["verdict"].startswith(verdict) and _smallest(dry) == need
    assert "nothing runs" in dry.stdout and not list(tmp_path.iterdir())
    real = _run(SCRIPT, OUT=str(tmp_path), **env)  # no DRY_RUN: one line, exit 2, before anything is written
    assert real.returncode == 2 and real.stdout == "" and not list(tmp_path.iterdir())
    assert real.stderr.count("\n") == 1 and f"start (exit 2) under BUDGET={env['BUDGET']}: {phase}" in real.stderr
    assert f"it needs BUDGET >= {need} s" in real.stderr
    forced = _run(SCRIPT, DRY_RUN="1", FORCE="1", **env)  # FORCE=1 would start it: the dry run says so with 0
    assert forced.returncode == 0 and _plan(forced)[phase]["verdict"].startswith(verdict)
    cpu = _run(SCRIPT, DRY_RUN="1", DEVICE="cpu", **env)  # the CPU proof's tiny sizes: the H200 figures do not bind
    assert cpu.returncode == 0 and "not enforced on DEVICE=cpu" in cpu.stdout


@pytest.mark.parametrize(("env", "phase", "verdict", "need"), FAILED)
def test_the_smallest_budget_passes_and_one_second_less_does_not(env, phase, verdict, need):
    ok = _run(SCRIPT, DRY_RUN="1", **{**env, "BUDGET": str(need)})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert {p["verdict"] for p in _plan(ok).values()} == {"runs"} and phase in _plan(ok)
    short = _run(SCRIPT, DRY_RUN="1", **{**env, "BUDGET": str(need - 1)})
    assert short.returncode == 2 and _plan(short)[phase]["verdict"] != "runs"


def test_the_plan_starts_each_phase_after_the_earlier_ones_typical_durations():
    proc = _run(SCRIPT, DRY_RUN="1", PHASES="carina_32k ideal carina_8k", BUDGET="240")  # run order, not PHASES'
    plan = _plan(proc)
    assert list(plan) == ["ideal", "carina_8k", "carina_32k"] and proc.returncode == 0
    assert [int(p["at"]) for p in plan.values()] == [0, 25 + 6, 25 + 6 + 71 + 6]
    assert plan["carina_32k"]["timeout"] == str(240 - 108 - 25 - 15) and _smallest(proc) == 108 + 72 + 40


def test_a_spill_past_its_cap_needs_spill_cap_not_budget(tmp_path):
    env = {"PHASES": "spill_8k", "SPILL_LAYERS": "32", "BUDGET": "560"}
    real = _run(SCRIPT, OUT=str(tmp_path), **env)
    assert real.returncode == 2 and "set SPILL_CAP" in real.stderr and "no BUDGET is enough" in real.stderr
    assert _run(SCRIPT, DRY_RUN="1", SPILL_CAP="480", **env).returncode == 0  # what lane_s6_spill7b.sh sets


def _logged() -> dict[str, list[int]]:
    """Every `== <phase>: rc=0 in N s` line of the s8 and s9 H200 logs, the chunked head's 32k apart."""
    seen: dict[str, list[int]] = {}
    for tar in (RESULTS / "s8" / "offload_s8_phases.tar.gz", RESULTS / "s9" / "offload_s9_phases.tar.gz"):
        with tarfile.open(tar) as archive:
            for member in archive.getmembers():
                if not member.name.endswith("s2.log"):
                    continue
                text = archive.extractfile(member).read().decode()
                for phase, secs in re.findall(r"^== (\w+): rc=0 in (\d+) s$", text, re.M):
                    key = f"{phase}_head" if "offhead" in member.name else phase
                    seen.setdefault(key, []).append(int(secs))
    return seen


def test_the_typical_durations_are_the_longest_in_the_committed_logs():
    logged = _logged()
    every = "gpu_tests ideal carina_8k carina_32k carina_128k spill_8k"
    plain = _plan(_run(SCRIPT, DRY_RUN="1", PHASES=every, SPILL_LAYERS="32", SPILL_CAP="480", BUDGET="2000"))
    head = _plan(_run(SCRIPT, DRY_RUN="1", PHASES="carina_32k", HEAD_CHUNK="4096", BUDGET="2000"))
    typical = {k: int(re.fullmatch(r"typical (\d+) s", p["typical"])[1]) for k, p in plain.items()}
    typical["carina_32k_head"] = int(re.fullmatch(r"typical (\d+) s", head["carina_32k"]["typical"])[1])
    assert typical == {k: max(v) for k, v in logged.items()}, logged
    four = _plan(_run(SCRIPT, DRY_RUN="1", PHASES="spill_8k", SPILL_LAYERS="4", BUDGET="2000"))
    assert four["spill_8k"]["typical"] == f"typical {-(-max(logged['spill_8k']) * 4 // 32)} s"  # scaled by layers


def test_the_documented_lane_commands_pass_and_the_combined_dry_run_runs_nothing(tmp_path):
    lanes = ["offload=benchmarks/offload/lane_s6_h200.sh:575", "spill7b=benchmarks/offload/lane_s6_spill7b.sh:575",
             "ckpt=benchmarks/ckpt/h100_s2.sh:150"]  # fmt: skip
    combined = REPO / "benchmarks" / "h100_combined.sh"
    ok = _run(combined, *lanes, DRY_RUN="1", OUT=str(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("== plan: the smallest BUDGET") == 2 and "ckpt: not checked, not run" in ok.stdout
    head = _run(combined, "offload=benchmarks/offload/lane_s6_h200.sh:315", DRY_RUN="1", OUT=str(tmp_path),
                HEAD_CHUNK="4096", PHASES="gpu_tests ideal carina_32k", BUDGET="300")  # fmt: skip
    assert head.returncode == 0, head.stdout + head.stderr
    bad = _run(combined, "offload=benchmarks/offload/lane_s6_h200.sh:120", DRY_RUN="1", OUT=str(tmp_path),
               PHASES="ideal carina_8k", BUDGET="110")  # fmt: skip
    assert bad.returncode == 2 and "carina_8k would be skipped" in bad.stderr and "plan exit 2" in bad.stdout
    tight = _run(combined, "offload=benchmarks/offload/lane_s6_h200.sh:562", DRY_RUN="1", OUT=str(tmp_path))
    assert tight.returncode == 2 and "a lane limit >= 565 s" in tight.stderr  # BUDGET 560 inside a 562 s limit
    assert not list(tmp_path.iterdir())
