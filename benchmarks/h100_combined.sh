#!/usr/bin/env bash
# One device call that runs several subsystems' device scripts in turn, each under its own time limit, and
# packs each one's results into $OUT/<lane>.tgz (the device machine returns at most 8 files).
# From the repository root:  OUT=<dir> bash benchmarks/h100_combined.sh lane=script:seconds ...
#   e.g. OUT=/tmp/o bash benchmarks/h100_combined.sh ckpt=benchmarks/ckpt/h100_s2.sh:150
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# GPU_TAG names the records of lanes that take it (h100, h200, ...): read from the GPU's name.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU_NAME" in *H200*) GPU_TAG=h200 ;; *H100*) GPU_TAG=h100 ;; *) GPU_TAG=gpu ;; esac
export GPU_TAG
# The device's copy of .git may predate the working tree it holds: the lead writes the commit into
# .device-commit (carried) before the call, and every record names it (carina.core.bench).
[ -f .device-commit ] && export CARINA_SOURCE_COMMIT=$(cat .device-commit)
ROOT_OUT=$OUT
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader 2>/dev/null | tee "$ROOT_OUT/combined.log"
for arg in "$@"; do
  lane=${arg%%=*}; rest=${arg#*=}; script=${rest%:*}; secs=${rest##*:}
  mkdir -p "/tmp/lanes/$lane"
  start=$(date +%s)
  echo "== $lane: $script (limit ${secs}s)" | tee -a "$ROOT_OUT/combined.log"
  OUT="/tmp/lanes" timeout --kill-after=5 "$secs" bash "$script" > "/tmp/lanes/$lane/stdout.log" 2>&1
  rc=$?
  echo "== $lane: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$ROOT_OUT/combined.log"
  tail -15 "/tmp/lanes/$lane/stdout.log" | tee -a "$ROOT_OUT/combined.log"
  tar -C /tmp/lanes -czf "$ROOT_OUT/$lane.tgz" "$lane"
done
