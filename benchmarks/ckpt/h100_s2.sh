#!/usr/bin/env bash
# carina.ckpt on the H100 machine: the stall record, the restore record (with peers), then the GPU tests.
# Superseded by benchmarks/ckpt/h200.sh (overhead at intervals, peak host memory, Llama 125M-1.3B); kept as
# the script session 2's H100 records name.
# TIME BUDGET: 240 s of run time in all -- give the lane a limit of >= 250 s. Steps, each under `timeout`
# (TERM, then KILL 2 s later): machine 5 s, stall 120 s, restore 75 s, GPU tests 40 s. BUDGET_S (default
# 240) clips every step to the time left, so a smaller lane limit loses the last steps, not the records.
# Expected ~110 s: stall ~45 s, restore ~30 s, tests ~22 s (they took 17.6 s on the H100 in session 2).
#
# Every step writes its record into $OUT/ckpt/ as it goes (never to /tmp, never only at the end):
#  - bench_stall.py writes ckpt_stall$SUFFIX.json after its setup (state size, step time, disk ceiling) and
#    again after every method, and logs every save (blocking, stall, durable) as it ends;
#  - bench_restore.py writes ckpt_restore$SUFFIX.json after every method (carina first).
# Key figures also go to stdout and to $OUT/ckpt/h100_s2.log.
#
# Sizing, from session 2's device call (949a4ce): at 1e8 parameters (1.21 GB state) the stall step's first
# method (carina-fork) had not finished 3 saves 55 s after the setup printed, and the 68 s limit killed it
# with nothing written; the restore step printed carina's figures 29 s in before the 120 s lane limit.
# Now: 5e7 parameters (0.60 GB state, ~0.6 s to persist at the 1.07 GB/s measured then), 3 reps, methods in
# the order thread, torch.save, process, dcp.async_save, fork, dcp.save (the suspect fork writer late),
# a save not durable within 20 s abandons its method (logged and recorded as an error; a forked child is
# killed), and no method starts after 80 s (--budget-s).
# Peak scratch disk ~2 GB, host RAM ~4 GB, /dev/shm ~1.4 GB for the process writer (an error is recorded
# and the run goes on if /dev/shm is smaller).
# Writes at most 3 files to $OUT/ckpt/: ckpt_stall$SUFFIX.json, ckpt_restore$SUFFIX.json, h100_s2.log.
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/h100_s2.sh
# Proof on a CPU machine with tiny sizes: DEVICE=cpu OUT=/tmp/ckpt_out bash benchmarks/ckpt/h100_s2.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then PARAMS_DEFAULT=4e6; SUFFIX_DEFAULT=_cpu_proof; else PARAMS_DEFAULT=5e7; SUFFIX_DEFAULT=_h100; fi
PARAMS=${PARAMS:-$PARAMS_DEFAULT}
REPS=${REPS:-3}
SUFFIX=${SUFFIX:-$SUFFIX_DEFAULT}
BUDGET_S=${BUDGET_S:-240}
SCRATCH=${SCRATCH:-.}            # a folder on the disk under test (the repository's disk by default)
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/ckpt"
# shellcheck source=benchmarks/ckpt/budget_steps.sh
. "$(dirname "$0")/budget_steps.sh"
lane_begin h100_s2.log "$SCRATCH/.ckpt_h100_s2.$$"

step "machine" 5 bash -c "nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader || true; df -h '$SCRATCH' | tail -1; df -h /dev/shm | tail -1; nproc"
step "stall ($DEVICE, $PARAMS params, $REPS reps)" 120 \
  "$PYTHON" benchmarks/ckpt/bench_stall.py --params "$PARAMS" --device "$DEVICE" --reps "$REPS" \
  --writers thread,process,fork --peers torch.save,dcp.async_save,dcp.save --budget-s 80 --save-deadline-s 20 \
  --dir "$WORK/stall" --name "ckpt_stall$SUFFIX"
rm -rf "$WORK/stall"
step "restore ($DEVICE, $PARAMS params, 2 reps)" 75 \
  "$PYTHON" benchmarks/ckpt/bench_restore.py --params "$PARAMS" --device "$DEVICE" --reps 2 --dir "$WORK" \
  --name "ckpt_restore$SUFFIX"
step "gpu tests (staging, writers, managed memory)" 40 \
  "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/ckpt/test_ckpt_gpu.py

echo "== summary (total $(($(date +%s) - start)) s, status $status)"
"$PYTHON" benchmarks/ckpt/ckpt_summary.py "$OUT/ckpt" "$SUFFIX"
echo "gpu tests: $(grep -E "[0-9]+ (passed|failed|skipped|error)" "$LOG" | head -1)"
exit "$status"
