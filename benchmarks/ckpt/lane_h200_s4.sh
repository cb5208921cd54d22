#!/usr/bin/env bash
# carina.ckpt on the H200, session 4: what the earlier runs could not show (issue 7).
#  1. stall   125M, carina fork (its writer now starts once a GPU copy ends), process, thread, with torch.save
#             and dcp.async_save in the same run, 4 saves each                      -> ckpt_stall_h200_s4.json
#  2. overhead 125M, carina process, a save every 25/50/100 steps, a clean window between every two
#             timed windows (T_clean = the mean of the two around each)          -> ckpt_overhead_h200_s4.json
#  3. offload carina.offload llama-1b (1.1B) under an 8 GiB cap, 8k tokens/step: carina process/thread/fork
#             and torch.save, each saving the offloaded run's state once, timed      -> ckpt_offload_h200_s4.json
#  4. sizes   350M then 1.3B: carina process and fork, torch.save, dcp.async_save, 2 saves each (appended to 1.)
# HARD BUDGET: BUDGET_S (default 480 s); each step under `timeout`, clipped to what is left; records are
# written into $OUT/ckpt/ after every method. Peak scratch disk ~35 GB and host RAM ~55 GB at 1.3B.
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/lane_h200_s4.sh
# CPU proof with tiny sizes: DEVICE=cpu OUT=/tmp/ck bash benchmarks/ckpt/lane_h200_s4.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then
  P1=2e6; SIZES=4e6,8e6; STEPS=30; INTERVALS=5,10,20; SUFFIX=_cpu_proof_s4
else
  P1=125e6; SIZES=350e6,1.3e9; STEPS=200; INTERVALS=25,50,100; SUFFIX=_h200_s4
fi
BUDGET_S=${BUDGET_S:-480}
PARTS=${PARTS:-stall overhead offload sizes}   # which steps run, in this order
SIZES=${SIZES_ONLY:-$SIZES}; SIZE_WRITERS=${SIZE_WRITERS:-process,fork}; SIZE_PEERS=${SIZE_PEERS:-torch.save,dcp.async_save}
SUFFIX=${SUFFIX_OVERRIDE:-$SUFFIX}
# shellcheck source=benchmarks/ckpt/budget_steps.sh
. "$(dirname "$0")/budget_steps.sh"
lane_env
lane_begin lane_s4.log "./.ckpt_s4.$$"

has stall && step "stall ($DEVICE, llama $P1)" 100 \
  "$PYTHON" $B/bench_stall.py "${COMMON[@]}" --params "$P1" --reps 4 --writers process,thread,fork \
  --peers dcp.async_save,torch.save --budget-s 80 --save-deadline-s 12 --name "ckpt_stall$SUFFIX"
rm -rf "$WORK/run"
has overhead && step "overhead ($DEVICE, llama $P1, K=$INTERVALS, 2 interleaved windows each)" 110 \
  "$PYTHON" $B/bench_overhead.py "${COMMON[@]}" --params "$P1" --steps $((STEPS / 2)) --intervals "$INTERVALS" \
  --methods carina-process --pairs 2 --budget-s 60 --name "ckpt_overhead$SUFFIX"
rm -rf "$WORK/run"
if [ "$DEVICE" = cpu ]; then OFF=(--model tiny --budget 4MiB); else OFF=(--model llama-1b --budget 12GiB --micro-batch 4 --seq-len 2048); fi
has offload && step "offload ($DEVICE, ${OFF[*]})" "${OFFLOAD_LIMIT:-110}" \
  "$PYTHON" $B/bench_offload.py --device "$DEVICE" "${OFF[@]}" --dir "$WORK/run" --deadline-s 40 \
  --methods carina-process,carina-thread,torch.save --name "ckpt_offload$SUFFIX"
rm -rf "$WORK/run"
SIZES_LIMIT=$(left)
has sizes && step "sizes ($DEVICE, llama $SIZES)" "$SIZES_LIMIT" \
  "$PYTHON" $B/bench_stall.py "${COMMON[@]}" --params "$SIZES" --reps 2 --writers "$SIZE_WRITERS" \
  --peers "$SIZE_PEERS" --budget-s $((SIZES_LIMIT - 8)) --save-deadline-s 40 --append \
  --name "ckpt_stall$SUFFIX"
rm -rf "$WORK/run"
echo "== summary (total $(($(date +%s) - start)) s of ${BUDGET_S}, status $status)" | tee -a "$LOG"
"$PYTHON" $B/ckpt_summary.py "$OUT/ckpt" "$SUFFIX" 2>&1 | tee -a "$LOG"
exit "$status"
