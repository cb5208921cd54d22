#!/usr/bin/env bash
# security.faults on the H100 (simulated figures; wall times measured): the full DVFS
# sweep (20 x 20 V x f grid x 12 images x 5 seeds, global window), the 1 ms local window at the
# vulnerable pairs at intensity 1 and 2, a 31-voltage boundary scan (0.532-0.544 V, 200 MHz) of the 1 ms window (the
# double-intensity effect where loss is not saturated), and a CPU vs CUDA vs reference-loop
# bit-equality check. Batched engine (carina.security.faults.engine) on device=cuda.
#
# TIME BUDGET: 120 s of run time (each step under `timeout`; the sweep gets what is left of 115 s;
# expected ~60 s on an H100: ~10k image forwards of the global sweep, ~5k cheaper ones after).
# Writes at most 3 files to $OUT/faults/: security_faults_sweep_h100.json (record),
# security_faults_sweep_h100_heatmap.png, sweep.log. Prints a summary table last.
#
# Usage (repository root): OUT=<dir> bash benchmarks/security_faults/h100_s2.sh
# CPU proof (tiny sizes):  DEVICE=cpu OUT=/tmp/faults_out bash benchmarks/security_faults/h100_s2.sh
set -uo pipefail
: "${OUT:?set OUT}"
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/faults"
# SkyNet weights + images: shared/data/skynet in the repository root when carried there, else ../shared.
[ -z "${CARINA_SHARED_DIR:-}" ] && [ -d shared/data/skynet ] && export CARINA_SHARED_DIR="$PWD/shared"
mkdir -p "$OUT/faults"
LOG="$OUT/faults/sweep.log"
: > "$LOG"
# Needs torch, h5py (dac.weights is HDF5), Pillow; matplotlib for the heat map (optional).
if ! timeout 20 "$PY" -c "import torch, h5py, PIL" >> "$LOG" 2>&1; then
  if ls .whl/h5py-*.whl > /dev/null 2>&1; then
    timeout 20 "$PY" -m pip install -q --no-index --no-deps --target /tmp/faults-site .whl/h5py-*.whl >> "$LOG" 2>&1
    export PYTHONPATH="$PYTHONPATH:/tmp/faults-site"
  fi
  timeout 20 "$PY" -c "import torch, h5py, PIL" >> "$LOG" 2>&1 || { echo "faults: missing torch/h5py/Pillow"; tail -3 "$LOG"; exit 2; }
fi
if [ "$DEVICE" = cpu ]; then
  ARGS=(--device cpu --grid 3 --images 1 --seeds 1 --scan 3 --batch 8 --name security_faults_sweep_cpu_smoke)
  LIMIT=900
else
  timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1
  ARGS=(--device "$DEVICE" --grid 20 --images 12 --seeds 5 --scan 31 --scan-v 0.532:0.544 --batch 128 --threads 8
        --name security_faults_sweep_h100)
  LIMIT=$(( 115 - SECONDS ))
fi
echo "== faults sweep: ${ARGS[*]} (limit ${LIMIT}s)" | tee -a "$LOG"
start=$(date +%s)
timeout "$LIMIT" "$PY" benchmarks/security_faults/bench_sweep.py "${ARGS[@]}" >> "$LOG" 2>&1
rc=$?
echo "== exit $rc after $(( $(date +%s) - start )) s" | tee -a "$LOG"
ls -la "$OUT/faults"
# Summary table (the bench prints it last; on a timeout, the last partial record's path is above).
tac "$LOG" | sed "/^== security.faults sweep/q" | tac
