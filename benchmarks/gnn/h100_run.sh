#!/usr/bin/env bash
# The single H100 session of carina.gnn: out-of-core vs in-memory (and peers) with features on disk,
# the machine's calibration and `carina gnn plan` output, and its detected topology.
# Usage (on the GPU machine, repository root): OUT=<dir> bash benchmarks/gnn/h100_run.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT"
DATA=/tmp/carina-gnn-h100
nvidia-smi topo -m > "$OUT/h100_nvidia_smi_topo.txt" 2>&1
python3 -m carina gnn topo --topology detect --json > "$OUT/h100_topo.json" 2>&1
python3 benchmarks/gnn/bench_outofcore.py --data "$DATA" --nodes 2097152 --dim 128 --fanouts 10,5 \
  --batch-size 1024 --hidden 256 --batches 10 --warmup 2 --budgets 0,0.2,0.6 --name gnn_outofcore_h100 \
  2>&1 | tail -5
python3 -m carina gnn calibrate "$DATA" --device cuda --size-mb 256 --out "$OUT/h100_machine.json" > /dev/null
COLUMNS=160 python3 -m carina gnn plan "$DATA" --machine "$OUT/h100_machine.json" --device cuda --fanouts 10,5 \
  --batch-size 1024 --max-ssds 8 > "$OUT/h100_plan.txt" 2>&1
cat "$OUT/h100_plan.txt"
