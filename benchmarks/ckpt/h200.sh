#!/usr/bin/env bash
# carina.ckpt on the H200 machine: the issue's benchmark (issue 7), most important records first.
# TIME BUDGET: 270 s of run time in all (BUDGET_S, default 270) -- give the call a limit of >= 285 s.
# Every step runs under `timeout` (TERM, then KILL 2 s later), clipped to the budget left:
#   machine      5 s   GPU, disks, /dev/shm, cores
#   stall       90 s   bench_stall, llama 125M (1.6 GB state), every method: carina thread/process/fork,
#                      torch.save(+fsync), dcp.async_save (thread mode), dcp.save, dcp.async_save in process
#                      mode (last: it makes a gloo process group); 4 saves each (medians of the last 3); no
#                      method starts after 68 s; a save not durable in 12 s abandons its method (recorded
#                      with what the writer process was doing, from /proc)        -> ckpt_stall_h200.json
#   overhead    85 s   bench_overhead, same model: a window of 200 steps clean, and with a save every
#                      25/50/100 steps, for the best carina writer of the stall record, torch.save and
#                      dcp.async_save; no method starts after 65 s               -> ckpt_overhead_h200.json
#   sizes      rest    bench_stall --append, llama 350M (4.5 GB) then 1.3B (16 GB): the best writer,
#                      torch.save, dcp.async_save, 2 saves each; a size or method whose expected time
#                      (the previous size's, scaled) does not fit is recorded as skipped; 70 s stay
#                      reserved for the two steps below                            -> into ckpt_stall_h200.json
#   restore     45 s   bench_restore, llama 125M: carina, torch.load, dcp.load, cold and warm   -> ckpt_restore_h200.json
#   gpu tests   25 s   tests/ckpt/test_ckpt_gpu.py (17.6 s on the H100)
# Expected ~255 s (350M only if the first steps leave room); 1.3B fits only with a larger budget (BUDGET_S=420 should reach it).
# Records are written into $OUT/ckpt/ as each step goes (after every method), never only at the end;
# at most 4 files: ckpt_stall_h200.json, ckpt_overhead_h200.json, ckpt_restore_h200.json, h200.log.
# Key figures are printed last in a short table (also in h200.log).
# Peak scratch disk ~35 GB at 1.3B (~10 GB without), host RAM ~55 GB at 1.3B (two 17 GB arenas, DCP's staged
# copy), /dev/shm 2x state for the process writer (an error is recorded and the run goes on if /dev/shm
# is smaller).
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/h200.sh
# Proof on a CPU machine with tiny sizes: DEVICE=cpu OUT=/tmp/ckpt_out bash benchmarks/ckpt/h200.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then
  P1_DEFAULT=2e6; SIZES_DEFAULT=4e6,8e6; STEPS_DEFAULT=40; INTERVALS_DEFAULT=5,10,20; SUFFIX_DEFAULT=_cpu_proof
else
  P1_DEFAULT=125e6; SIZES_DEFAULT=350e6,1.3e9; STEPS_DEFAULT=200; INTERVALS_DEFAULT=25,50,100; SUFFIX_DEFAULT=_h200
fi
P1=${P1:-$P1_DEFAULT}; SIZES=${SIZES:-$SIZES_DEFAULT}; STEPS=${STEPS:-$STEPS_DEFAULT}
INTERVALS=${INTERVALS:-$INTERVALS_DEFAULT}; SUFFIX=${SUFFIX:-$SUFFIX_DEFAULT}
BUDGET_S=${BUDGET_S:-270}
SCRATCH=${SCRATCH:-.}            # a folder on the disk under test (the repository's disk by default)
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/ckpt"
# shellcheck source=benchmarks/ckpt/budget_steps.sh
. "$(dirname "$0")/budget_steps.sh"
lane_begin h200.log "$SCRATCH/.ckpt_h200.$$"

step "machine" 5 bash -c "nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader || true; df -h '$SCRATCH' | tail -1; df -h /dev/shm | tail -1; nproc; free -g | head -2; cat /sys/kernel/mm/transparent_hugepage/enabled"
step "stall ($DEVICE, llama $P1, every method)" 90 \
  "$PYTHON" $B/bench_stall.py "${COMMON[@]}" --params "$P1" --reps 4 --writers thread,process,fork \
  --peers torch.save,dcp.async_save,dcp.save,dcp.async_process --budget-s 68 --save-deadline-s 12 \
  --name "ckpt_stall$SUFFIX"
rm -rf "$WORK/run"
BEST=$("$PYTHON" -c "import json,sys; print(next(iter(json.load(open(sys.argv[1]))['metrics']['best_writer'].values())))" \
  "$OUT/ckpt/ckpt_stall$SUFFIX.json" 2>/dev/null || echo thread)
echo "== best carina writer by stall: $BEST" | tee -a "$LOG"
step "overhead ($DEVICE, llama $P1, K=$INTERVALS)" 85 \
  "$PYTHON" $B/bench_overhead.py "${COMMON[@]}" --params "$P1" --steps "$STEPS" --intervals "$INTERVALS" \
  --methods "carina-$BEST,torch.save,dcp.async_save" --budget-s 65 --name "ckpt_overhead$SUFFIX"
rm -rf "$WORK/run"
SIZES_LIMIT=$(($(left) - 70))
step "sizes ($DEVICE, llama $SIZES)" "$SIZES_LIMIT" \
  "$PYTHON" $B/bench_stall.py "${COMMON[@]}" --params "$SIZES" --reps 2 --writers "$BEST" \
  --peers torch.save,dcp.async_save --budget-s $((SIZES_LIMIT - 6)) --save-deadline-s 40 --append \
  --name "ckpt_stall$SUFFIX"
rm -rf "$WORK/run"
step "restore ($DEVICE, llama $P1, 2 reps)" 45 \
  "$PYTHON" $B/bench_restore.py --model llama --params "$P1" --device "$DEVICE" --reps 2 --dir "$WORK" \
  --name "ckpt_restore$SUFFIX"
step "gpu tests (staging, writers, managed memory)" 25 \
  "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/ckpt/test_ckpt_gpu.py

echo "== summary (total $(($(date +%s) - start)) s of ${BUDGET_S}, status $status)" | tee -a "$LOG"
"$PYTHON" $B/ckpt_summary.py "$OUT/ckpt" "$SUFFIX" 2>&1 | tee -a "$LOG"
echo "gpu tests: $(grep -E "[0-9]+ (passed|failed|skipped|error)" "$LOG" | tail -1)" | tee -a "$LOG"
exit "$status"
