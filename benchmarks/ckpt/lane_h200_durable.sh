#!/usr/bin/env bash
# carina.ckpt on the H200 (written in session 10): decide issue 7's time-until-durable goal at the 7B shape.
# Session 10's record (ckpt_offload7b_h200_s10) has carina process durable in 14.035 s for 22.57 GB against a
# 10.58 s bound from the best 4 GiB pass (2.687 GB/s), while the probe after the run fell pass by pass (2.405,
# 2.133, 1.900 GB/s): whether the disk writes 22.6 GB as fast as 4 GiB, or the writer is slower than the disk,
# the record cannot say. This lane runs bench_offload.py once, carina.offload llama2-7b's shape at 8 of 32
# layers (1.88 B params, 22.6 GB state), 24 GiB device budget, 4x2048 tokens/step, methods carina process and
# carina thread (the stall peers were measured in s10's run), with --probe-same: after each method's untimed
# save a probe writes as many bytes as that save, in its folder, the way the writers write (carina.io,
# O_DIRECT, 64 MiB requests, one fsync), then deletes it; one training step later the timed save. Each row
# gets the bound from that same-size write (durable_bound_same_s, within_bound_same), the writer's timeline
# (bytes submitted / written / checksummed and the copy frontier against time, the feeder's waits) and
# 'limit', what held the write phase back, by rules fixed before the run (write_probe.py):
# disk | copies | io_path | feeder. metrics.writes keeps both timelines and their GB/s per 4 GiB written.
# The 4 GiB probes (before the model, after the last method) stay, so s10's bound can be recomputed.
#                                                                   -> ckpt_offload7b$SUFFIX.json
# Estimate (from s10's wall_s and steps, not a measurement): ~100 s setup and teardown, ~18 s the two 4 GiB
# probes, per method ~75 s (untimed save in flight ~17 s, same-size probe ~9-14 s + its deletion ~7 s, one
# step, timed save ~22 s in flight, 3 clean steps, closing and deleting the method's folder ~8 s):
# ~270 s. Peak: host RAM ~95 GB, disk ~46 GB (untimed checkpoint + probe, then + the timed one), /dev/shm
# ~48 GB. HARD BUDGET: BUDGET_S (default 290 s); give the call 310 s.
# Usage (repository root, carry .whl-ckpt from benchmarks/ckpt/fetch_h200_carry.sh):
#   OUT=<dir> bash benchmarks/ckpt/lane_h200_durable.sh
# CPU proof with tiny sizes: DEVICE=cpu OUT=/tmp/ckd bash benchmarks/ckpt/lane_h200_durable.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then
  SUFFIX=_cpu_proof_durable; LIMIT=150; START_BY=90
  OFF=(--model tiny --layers 4 --budget 4MiB --probe-mb 64)
else
  SUFFIX=_h200_s11; LIMIT=280; START_BY=200
  OFF=(--model llama2-7b --layers 8 --budget 24GiB --micro-batch 4 --seq-len 2048 --probe-mb 4096)
fi
BUDGET_S=${BUDGET_S:-290}
SUFFIX=${SUFFIX_OVERRIDE:-$SUFFIX}
# shellcheck source=benchmarks/ckpt/budget_steps.sh
. "$(dirname "$0")/budget_steps.sh"
lane_env
lane_begin lane_durable.log "./.ckpt_s11.$$"

step "offload7b durable ($DEVICE, ${OFF[*]}, same-size probes)" "${OFFLOAD_LIMIT:-$LIMIT}" \
  "$PYTHON" $B/bench_offload.py --device "$DEVICE" "${OFF[@]}" --probe-same --dir "$WORK/run" --deadline-s 90 \
  --methods "${OFFLOAD_METHODS:-carina-process,carina-thread}" --budget-s "${OFFLOAD_START_BY:-$START_BY}" \
  --name "ckpt_offload7b$SUFFIX"
rm -rf "$WORK/run"
echo "== summary (total $(($(date +%s) - start)) s of ${BUDGET_S}, status $status)" | tee -a "$LOG"
exit "$status"
