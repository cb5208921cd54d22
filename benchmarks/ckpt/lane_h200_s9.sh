#!/usr/bin/env bash
# carina.ckpt on the H200, session 9: the 7B-shape offload run with dcp.async_save that session 8 had no time for,
# then the overhead and time-to-durable goals of issue 7 again after the session-8 changes.
#  gputest  tests/ckpt/test_ckpt_gpu.py (-m gpu): staging with and without the device snapshot, back-to-back
#            saves each the pre-step state, every writer, managed memory: session 8 changed how the stager
#            keeps its arena and device-buffer views, which only a GPU runs (~20 s)
#  offload7b bench_offload.py, carina.offload llama2-7b's shape at OFFLOAD_LAYERS (default 8) of its 32 layers
#            (1.88 B params, 22.6 GB state), 24 GiB device budget, 4x2048 tokens/step: carina process, then
#            dcp.async_save (s7 cut it: 'skipped: time budget'; s8 never ran the part), then torch.save (cold)
#            and carina thread, one timed save each, none started after OFFLOAD_START_BY s (160: torch.save or
#            thread is what a short budget cuts); the disk probed in the checkpoint folder in the same run,
#            before the model is built and after the last method (an untimed pass, then the best of 3 passes of
#            OFFLOAD_PROBE_MB, default 4096 MiB, O_DIRECT + fsync: ~7 s each at ~2 GB/s, outside the
#            OFFLOAD_START_BY clock), so each method's row gets its bytes, bound and within_bound
#                                                                      -> ckpt_offload7b$SUFFIX.json
#            (~265 s: ~60 s setup, ~45 s process, ~90 s dcp.async_save, ~40 s torch.save, ~15 s the two probes)
#  overhead  bench_overhead_paired.py, llama OVERHEAD_PARAMS (default 350M), carina process, as in session 8
#            (interleaved clean / checkpointed blocks of K steps, K auto = 2.5x the slowest of two calibration
#            saves, writer at niceness +10, <= 12 pairs) with save() building its slot views once per arena
#            (s8: 0.083 s blocking per save = 1.5 of its 3.7 points)  -> ckpt_overhead_paired$SUFFIX.json
#            (~150 s at 350M: ~16 s setup, ~10 s warm-up and calibration saves, ~12.5 s per pair at K ~ 54)
#  fork      bench_fork_write.py, a synthetic FORK_MB (default 2048 MiB) state, no training, FORK_REPS (5) rounds
#            of one save per method, order rotated: the fork writer as shipped (its grandchild writes one 64 MiB
#            O_DIRECT request at a time, as s7), the s8 default (8 x 16 MiB in flight through io_uring:
#            carina-fork-queued), 4 x 64 MiB in flight (carina-fork-queued-4x64), process, torch.save; every
#            save kept, io-wq workers counted; the disk's bandwidth the best of 3 passes after an untimed one
#                                                                      -> ckpt_fork_write$SUFFIX.json
#            (~75 s)
# HARD BUDGET: BUDGET_S (default 560 s, + ~5 s of lane_env setup before the clock starts: give the call 580 s; the
# parts' limits sum to 570 s, so a run of all four whose earlier parts use their whole limits clips fork); each
# step under `timeout`, clipped to what is left; each benchmark rewrites its record in $OUT/ckpt/ after every
# method / pair / round. Peak: host RAM ~95 GB, disk ~46 GB, /dev/shm ~48 GB (offload7b).
# Usage (repository root): OUT=<dir> bash benchmarks/ckpt/lane_h200_s9.sh   (PARTS="offload7b" etc. for a subset)
# CPU proof with tiny sizes: DEVICE=cpu OUT=/tmp/ck bash benchmarks/ckpt/lane_h200_s9.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then
  OV_PARAMS=2e6; OV_LIMIT=200; SUFFIX=_cpu_proof_s9
  OFF=(--model tiny --layers 4 --budget 4MiB --probe-mb 64); OFF_LIMIT=100; START_BY=60; FORK_MB=128; FORK_REPS=2
else
  OV_PARAMS=350e6; OV_LIMIT=150; SUFFIX=_h200_s9
  OFF=(--model llama2-7b --layers "${OFFLOAD_LAYERS:-8}" --budget 24GiB --micro-batch 4 --seq-len 2048
       --probe-mb "${OFFLOAD_PROBE_MB:-4096}")
  OFF_LIMIT=285; START_BY=160; FORK_MB=${FORK_MB:-2048}; FORK_REPS=${FORK_REPS:-5}
fi
BUDGET_S=${BUDGET_S:-560}
PARTS=${PARTS:-gputest offload7b overhead fork}   # which steps run (always in the order below)
OV_PARAMS=${OVERHEAD_PARAMS:-$OV_PARAMS}; OV_LIMIT=${OVERHEAD_LIMIT:-$OV_LIMIT}
OFF_LIMIT=${OFFLOAD_LIMIT:-$OFF_LIMIT}; START_BY=${OFFLOAD_START_BY:-$START_BY}
SUFFIX=${SUFFIX_OVERRIDE:-$SUFFIX}
# shellcheck source=benchmarks/ckpt/budget_steps.sh
. "$(dirname "$0")/budget_steps.sh"
lane_env
lane_begin lane_s9.log "./.ckpt_s9.$$"

has gputest && step "gpu tests (staging, device snapshot, writers, managed memory)" 25 \
  "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/ckpt/test_ckpt_gpu.py
has offload7b && step "offload7b ($DEVICE, ${OFF[*]})" "$OFF_LIMIT" \
  "$PYTHON" $B/bench_offload.py --device "$DEVICE" "${OFF[@]}" --dir "$WORK/run" --deadline-s 90 \
  --methods "${OFFLOAD_METHODS:-carina-process,dcp.async_save,torch.save,carina-thread}" --cold torch.save \
  --budget-s "$START_BY" --name "ckpt_offload7b$SUFFIX"
rm -rf "$WORK/run"
has overhead && step "overhead ($DEVICE, llama $OV_PARAMS, K=auto 2.5x the slowest calibration save)" "$OV_LIMIT" \
  "$PYTHON" $B/bench_overhead_paired.py "${COMMON[@]}" --params "$OV_PARAMS" --intervals auto \
  --interval-factor 2.5 --calib-saves 2 --methods "${OVERHEAD_METHODS:-carina-process}" --pairs 12 --min-pairs 3 \
  --budget-s $((OV_LIMIT - 20)) --save-deadline-s 40 --name "ckpt_overhead_paired$SUFFIX"
rm -rf "$WORK/run"
has fork && step "fork ($DEVICE, ${FORK_MB} MiB synthetic state, $FORK_REPS rounds)" 110 \
  "$PYTHON" $B/bench_fork_write.py --size-mb "$FORK_MB" --reps "$FORK_REPS" --dir "$WORK/run" \
  --variants carina-fork-queued,carina-fork-queued-4x64 --name "ckpt_fork_write$SUFFIX"
rm -rf "$WORK/run"
echo "== summary (total $(($(date +%s) - start)) s of ${BUDGET_S}, status $status)" | tee -a "$LOG"
exit "$status"
