#!/usr/bin/env bash
# carina.ckpt on the H100 machine, session 2: GPU tests (managed memory included), the stall record and the
# restore-time record. TIME BUDGET: 150 s of run time in all (every step under `timeout`: 4 + 28 + 68 + 44 s,
# each killed 1 s after its TERM at worst, summary ~1 s);
# expected ~110 s. Peak scratch disk ~4 GB (three 1.2 GB copies in the restore step), host RAM ~6 GB,
# /dev/shm ~2.6 GB for the process writer (it records an error and the run goes on if /dev/shm is smaller).
# Sized from the last run, whose 3e8-parameter stall step (3 reps, 3 writers, 3 peers) overran its limit:
# 1e8 parameters (1.2 GB of fp32 params + AdamW moments, ~0.8 s to persist at 1.5 GB/s), 3 reps (medians over
# saves 2..3), and bench_stall's --budget-s skips the methods left once 40 s have passed.
# Writes at most 3 files to $OUT/ckpt/: ckpt_stall_h100.json, ckpt_restore_h100.json, h100_s2.log.
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/h100_s2.sh
# Proof on a CPU machine with tiny sizes: DEVICE=cpu OUT=/tmp/ckpt_out bash benchmarks/ckpt/h100_s2.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then PARAMS_DEFAULT=4e6; SUFFIX_DEFAULT=_cpu_proof; else PARAMS_DEFAULT=1e8; SUFFIX_DEFAULT=_h100; fi
PARAMS=${PARAMS:-$PARAMS_DEFAULT}
REPS=${REPS:-3}
SUFFIX=${SUFFIX:-$SUFFIX_DEFAULT}
SCRATCH=${SCRATCH:-.}            # a folder on the disk under test (the repository's disk by default)
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/ckpt"
mkdir -p "$OUT/ckpt"
LOG="$OUT/ckpt/h100_s2.log"
WORK="$SCRATCH/.ckpt_h100_s2.$$"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
status=0
step() {  # step NAME SECONDS CMD...: run under timeout, log everything, never abort the script
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, at $(($(date +%s) - start)) s)" | tee -a "$LOG"
  timeout --signal=TERM --kill-after=1 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - start)) s" | tee -a "$LOG"
  [ $rc -eq 0 ] || status=1
  return 0
}

step "machine" 4 bash -c "nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader || true; df -h '$SCRATCH' | tail -1; df -h /dev/shm | tail -1; nproc"
step "gpu tests (staging, writers, managed memory)" 28 \
  "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/ckpt/test_ckpt_gpu.py
step "stall ($DEVICE, $PARAMS params, $REPS reps)" 68 \
  "$PYTHON" benchmarks/ckpt/bench_stall.py --params "$PARAMS" --device "$DEVICE" --reps "$REPS" --budget-s 40 \
  --dir "$WORK/stall" --name "ckpt_stall$SUFFIX"
rm -rf "$WORK/stall"
step "restore ($DEVICE, $PARAMS params, 2 reps)" 44 \
  "$PYTHON" benchmarks/ckpt/bench_restore.py --params "$PARAMS" --device "$DEVICE" --reps 2 --dir "$WORK" \
  --name "ckpt_restore$SUFFIX"

echo "== summary (total $(($(date +%s) - start)) s, status $status)"
"$PYTHON" - "$OUT/ckpt" "$SUFFIX" <<'EOF'
import json, sys
from pathlib import Path
root, suffix = Path(sys.argv[1]), sys.argv[2]
stall = root / f"ckpt_stall{suffix}.json"
if stall.is_file():
    m = json.loads(stall.read_text())["metrics"]
    print(f"stall: state {m['state_bytes'] / 1e9:.2f} GB, step {m['step_s_median'] * 1e3:.1f} ms, "
          f"disk write {m['disk_write_Bps'] / 1e9:.2f} GB/s")
    print(f"{'method':16} {'blocking_s':>10} {'stall_s':>9} {'durable_s':>9} {'first_s':>8}")
    for r in m["summary"]:
        if "stall_s_median" in r:
            print(f"{r['method']:16} {r['blocking_s_median']:10.4f} {r['stall_s_median']:9.4f} "
                  f"{r['durable_s_median']:9.3f} {r['first_stall_s']:8.3f}")
        else:
            print(f"{r['method']:16} {r.get('note', '')[:60]}")
else:
    print("stall: no record")
restore = root / f"ckpt_restore{suffix}.json"
if restore.is_file():
    m = json.loads(restore.read_text())["metrics"]
    print(f"restore: state {m['state_bytes'] / 1e9:.2f} GB, disk read {m['disk_read_Bps'] / 1e9:.2f} GB/s "
          f"(ceiling {m['state_bytes'] / m['disk_read_Bps']:.2f} s); carina read+verify {m['read_verify_cold_s_median']:.3f} s")
    print(f"{'method':16} {'cold_s':>8} {'warm_s':>8} {'cold_GB/s':>9} bitwise")
    for r in m["summary"]:
        print(f"{r['method']:16} {r['cold_s_median']:8.3f} {r['warm_s_median']:8.3f} {r['cold_GBps']:9.3f} {r['bitwise']}")
else:
    print("restore: no record")
EOF
echo "gpu tests: $(grep -E "[0-9]+ (passed|failed|skipped|error)" "$LOG" | head -1)"
exit "$status"
