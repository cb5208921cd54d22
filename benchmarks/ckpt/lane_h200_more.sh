#!/usr/bin/env bash
# Session 3's second ckpt lane on the H200: what benchmarks/ckpt/h200.sh's first run left out for time.
#  1. stall at 125M for the methods its 68 s method budget never started: carina's fork writer, dcp.save and
#     dcp.async_save in process mode (record ckpt_stall_h200_rest; the first run's ckpt_stall_h200 holds
#     thread, process, torch.save and dcp.async_save at the same size and settings);
#  2. the next size, 350M, with carina's best writer (process), torch.save and dcp.async_save (record
#     ckpt_stall_sizes_h200).
# HARD BUDGET 150 s (70 + 75 s, each step under `timeout`); records written into $OUT/ckpt/ as each method ends.
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/lane_h200_more.sh
set -uo pipefail
: "${OUT:?set OUT}"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/ckpt"
mkdir -p "$OUT/ckpt"
WORK=./.ckpt_more.$$
trap 'rm -rf "$WORK"' EXIT
DEVICE=${DEVICE:-cuda}   # DEVICE=cpu P1=2e6 P2=4e6: the CPU proof of this script
P1=${P1:-125e6}; P2=${P2:-350e6}
COMMON=(--model llama --device "$DEVICE" --dir "$WORK/run")
timeout --signal=TERM --kill-after=2 70 python3 benchmarks/ckpt/bench_stall.py "${COMMON[@]}" --params "$P1" --reps 4 \
  --writers fork --peers dcp.save,dcp.async_process --budget-s 55 --save-deadline-s 12 --name ckpt_stall_h200_rest
echo "== stall rest: exit $?"
rm -rf "$WORK/run"
timeout --signal=TERM --kill-after=2 75 python3 benchmarks/ckpt/bench_stall.py "${COMMON[@]}" --params "$P2" --reps 2 \
  --writers process --peers torch.save,dcp.async_save --budget-s 62 --save-deadline-s 30 --name ckpt_stall_sizes_h200
echo "== sizes: exit $?"
python3 benchmarks/ckpt/ckpt_summary.py "$OUT/ckpt" _h200_rest 2>&1 | tail -12
python3 benchmarks/ckpt/ckpt_summary.py "$OUT/ckpt" _sizes_h200 2>&1 | tail -12
