#!/usr/bin/env bash
# carina.ckpt on the H200, session 7: the two goals of issue 7 that no record settles yet.
#  overhead  bench_overhead_paired.py, llama OVERHEAD_PARAMS (default 350M; 1.3e9 needs OVERHEAD_LIMIT=200),
#            carina process: interleaved clean / checkpointed blocks of K steps, K = the shortest interval the
#            goal applies to (K x step >= 2 x persist), as many pairs as the limit allows (<= 12); the overhead
#            with its 95 % interval and the verdict met / missed / unresolved     -> ckpt_overhead_paired$SUFFIX.json
#            (~150 s at 350M: ~30 s setup and first save, ~7.5 s per pair)
#  offload7b bench_offload.py, carina.offload llama2-7b's shape at OFFLOAD_LAYERS (default 8) of its 32 layers
#            (1.88 B params, 22.6 GB state: the full 7B's 81 GB state fits neither the 64 GB disk nor, with the
#            two staging arenas, the 125 GB RAM; offload_fit.py lowers the layers further if the free RAM, disk
#            or /dev/shm measured at the start cannot hold the run), 24 GiB device budget, 4x2048 tokens/step:
#            carina process, torch.save (cold: its first save is timed), dcp.async_save, carina thread, one
#            timed save each, none started after OFFLOAD_START_BY s          -> ckpt_offload7b$SUFFIX.json
#            (~240 s: ~60 s setup, ~45 s process, ~40 s torch.save, ~90 s dcp.async_save)
#  fork      bench_fork_write.py, a synthetic FORK_MB (default 2048 MiB) state, no training: the fork writer
#            (a grandchild writes with O_DIRECT while the child checksums), the same writer with its child
#            writing O_DIRECT then checksumming, and with its old buffered child, process, torch.save, 2 saves
#            each after an untimed one, the disk's bandwidth in the same run -> ckpt_fork_write$SUFFIX.json (~90 s)
# HARD BUDGET: BUDGET_S (default 500 s); each step under `timeout`, clipped to what is left; each benchmark
# rewrites its record in $OUT/ckpt/ after every pair / method. Peak: host RAM ~95 GB, disk ~46 GB, /dev/shm ~48 GB.
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/lane_h200_s7.sh
# CPU proof with tiny sizes: DEVICE=cpu OUT=/tmp/ck bash benchmarks/ckpt/lane_h200_s7.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then
  OV_PARAMS=2e6; OV_LIMIT=70; SUFFIX=_cpu_proof_s7
  OFF=(--model tiny --layers 4 --budget 4MiB); OFF_LIMIT=100; START_BY=60; FORK_MB=256
else
  OV_PARAMS=350e6; OV_LIMIT=150; SUFFIX=_h200_s7
  OFF=(--model llama2-7b --layers "${OFFLOAD_LAYERS:-8}" --budget 24GiB --micro-batch 4 --seq-len 2048)
  OFF_LIMIT=240; START_BY=150; FORK_MB=${FORK_MB:-2048}
fi
BUDGET_S=${BUDGET_S:-500}
PARTS=${PARTS:-overhead offload7b fork}   # which steps run, in this order
OV_PARAMS=${OVERHEAD_PARAMS:-$OV_PARAMS}; OV_LIMIT=${OVERHEAD_LIMIT:-$OV_LIMIT}
OFF_LIMIT=${OFFLOAD_LIMIT:-$OFF_LIMIT}; START_BY=${OFFLOAD_START_BY:-$START_BY}
SUFFIX=${SUFFIX_OVERRIDE:-$SUFFIX}
# shellcheck source=benchmarks/ckpt/budget_steps.sh
. "$(dirname "$0")/budget_steps.sh"
lane_env
lane_begin lane_s7.log "./.ckpt_s7.$$"

has overhead && step "overhead ($DEVICE, llama $OV_PARAMS, K=auto, interleaved blocks)" "$OV_LIMIT" \
  "$PYTHON" $B/bench_overhead_paired.py "${COMMON[@]}" --params "$OV_PARAMS" --intervals auto \
  --methods "${OVERHEAD_METHODS:-carina-process}" --pairs 12 --min-pairs 3 --budget-s $((OV_LIMIT - 20)) \
  --save-deadline-s 40 --name "ckpt_overhead_paired$SUFFIX"
rm -rf "$WORK/run"
has offload7b && step "offload7b ($DEVICE, ${OFF[*]})" "$OFF_LIMIT" \
  "$PYTHON" $B/bench_offload.py --device "$DEVICE" "${OFF[@]}" --dir "$WORK/run" --deadline-s 90 \
  --methods "${OFFLOAD_METHODS:-carina-process,torch.save,dcp.async_save,carina-thread}" --cold torch.save \
  --budget-s "$START_BY" --name "ckpt_offload7b$SUFFIX"
rm -rf "$WORK/run"
has fork && step "fork ($DEVICE, ${FORK_MB} MiB synthetic state)" 100 \
  "$PYTHON" $B/bench_fork_write.py --size-mb "$FORK_MB" --reps 2 --dir "$WORK/run" --name "ckpt_fork_write$SUFFIX"
rm -rf "$WORK/run"
echo "== summary (total $(($(date +%s) - start)) s of ${BUDGET_S}, status $status)" | tee -a "$LOG"
exit "$status"
