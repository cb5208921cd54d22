#!/usr/bin/env bash
# One device call that runs several subsystems' device scripts in turn, each under its own time limit, and
# packs each one's results into $OUT/<lane>.tgz (the device machine returns at most 8 files).
# From the repository root:  OUT=<dir> bash benchmarks/h100_combined.sh lane=script:seconds ...
#   e.g. OUT=/tmp/o bash benchmarks/h100_combined.sh ckpt=benchmarks/ckpt/h100_s2.sh:150
#   DRY_RUN=1 OUT=/tmp/o bash benchmarks/h100_combined.sh offload=benchmarks/offload/lane_s6_h200.sh:255
#   (any machine) prints each lane's plan and runs nothing; it exits 2 if a lane's run would refuse to start.
#   Only benchmarks/offload/h100_s2.sh and the lane scripts that exec it take DRY_RUN; other lanes are not run.
# Each lane sees its limit as LANE_LIMIT_S (h100_s2.sh refuses a BUDGET within 5 s of it).
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if [ "${DRY_RUN:-0}" = 1 ]; then
  worst=0
  for arg in "$@"; do
    lane=${arg%%=*}; rest=${arg#*=}; script=${rest%:*}; secs=${rest##*:}
    echo "== $lane: $script (limit ${secs}s), dry run"
    if [ "$script" != benchmarks/offload/h100_s2.sh ] && ! grep -q '^exec bash benchmarks/offload/h100_s2.sh' "$script"; then
      echo "== $lane: not checked, not run (its script takes no DRY_RUN)"; continue
    fi
    LANE_LIMIT_S=$secs OUT=${OUT:-/tmp/lanes} bash "$script"
    rc=$?; echo "== $lane: plan exit $rc"; (( rc > worst )) && worst=$rc
  done
  exit "$worst"
fi
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
  marker="/tmp/lanes/.start-$lane"; touch "$marker"; sleep 1  # files written after this are the lane's
  echo "== $lane: $script (limit ${secs}s)" | tee -a "$ROOT_OUT/combined.log"
  OUT="/tmp/lanes" LANE_LIMIT_S=$secs timeout --kill-after=5 "$secs" bash "$script" > "/tmp/lanes/$lane/stdout.log" 2>&1
  rc=$?
  echo "== $lane: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$ROOT_OUT/combined.log"
  tail -15 "/tmp/lanes/$lane/stdout.log" | tee -a "$ROOT_OUT/combined.log"
  # Pack the lane's folder AND every file any lane script wrote under /tmp/lanes during this lane: a script
  # writes under its own LANE name (e.g. offload/, peers8k/), which need not be this argument's name.
  (cd /tmp/lanes && { find "$lane" -type f; find . -mindepth 2 -type f -newer "$marker" ! -path "./$lane/*" \
    | sed 's|^\./||'; } | sort -u > "/tmp/lanes/.files-$lane")
  others=$(grep -v "^$lane/" "/tmp/lanes/.files-$lane" | cut -d/ -f1 | sort -u | tr '\n' ' ')
  [ -n "$others" ] && echo "== $lane: also packed what it wrote under: $others" | tee -a "$ROOT_OUT/combined.log"
  tar -C /tmp/lanes -czf "$ROOT_OUT/$lane.tgz" -T "/tmp/lanes/.files-$lane"
done
