#!/usr/bin/env bash
# carina.gnn device lane, session 6 (one H200, 16 cores, 128 GB RAM, ~64 GB free virtio disk at ~2 GB/s).
# HARD BUDGET: 540 s of run time in total (BUDGET_S), every step under `timeout`, each limit clipped to what
# is left (benchmarks/ckpt/budget_steps.sh); later steps keep a reserve so an early step cannot eat them.
# Steps, in priority order (what runs first is what matters most):
#   1. preflight (GPU, disk, memory)                                                                 ~5 s
#   2. calibrate: disk IOPS/bandwidth through the gather path the store now uses, H2D, gathers     <=25 s
#   3. bench_read_path: read_batch-per-run (the old store) vs one gather vs sync preads, same plans  <=40 s
#      on this disk (the mechanism behind "sync reads beat carina" in sessions 1-3)
#   4. prepare papers-like at 2^26 nodes (67M, ~1.0e9 edges, 128-d fp32 = 32 GiB of features + 4.5 GB
#      topology: it fits the free disk once); predicted ~17 s of feature writes at ~2 GB/s (features are
#      hashed from node ids on the GPU; benchmarks/results/cpu/gnn_generate.json) + ~15-30 s of topology.
#      If it fails (device memory, time), 2^25 nodes (16 GiB) with what is left.                   <=150 s
#   5. bench_outofcore [25,10] @ 8000, SAGE hidden 256: in-memory, host-gather (pinned), carina at cache
#      0/25/50/75/100%, the model's pick vs gap 0 / gap x4 / no pipelining, cold mmap, sync reads; every
#      system time-boxed to RUN_A s; in-memory/host tables and cache fills from the generator on the GPU
#      (file checked on 4096 rows first)                                                        rest - 140 s
#   6. bench_outofcore [15,10,5] @ 1024 (3 layers): the same systems at the same budgets, no ablations,
#      time-boxed to RUN_B s                                                                    rest - 35 s
#   7. carina gnn plan on the dataset with 16 GB GPU / 32 GB host for the cache (an out-of-core plan)  <=30 s
# Records (JSON) go to $OUT/gnn/ as each step ends (bench_outofcore rewrites its record after every system,
# so a step cut by its timeout keeps what finished); log.txt has every step's output.
# Usage (repository root): OUT=<dir> bash benchmarks/gnn/lane_h200_s6.sh
#   via the combined driver: OUT=$OUT bash benchmarks/h100_combined.sh gnn=benchmarks/gnn/lane_h200_s6.sh:550
# Proof on CPU (tiny sizes, run on the 2-core machine): DEVICE=cpu OUT=/tmp/gnn_s6 bash benchmarks/gnn/lane_h200_s6.sh
set -u
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/gnn"
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT/gnn"
LOG="$OUT/gnn/log.txt"
: >"$LOG"
WORK=${WORK:-$PWD/.gnn_s6}
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
status=0
# shellcheck source=../ckpt/budget_steps.sh
. benchmarks/ckpt/budget_steps.sh
if [ "$DEVICE" = cpu ]; then
  TAG=cpu_s6 NODES=16384 NODES_SMALL=8192 BATCH_A=256 BATCH_B=64 HIDDEN=32 CAL_MB=32 RP_NODES=16384
  RUN_A=4 RUN_B=3 RESERVE_A=60 RESERVE_B=15
else
  TAG=${GPU_TAG:-h200} NODES=67108864 NODES_SMALL=33554432 BATCH_A=8000 BATCH_B=1024 HIDDEN=256 CAL_MB=512
  RP_NODES=262144 RUN_A=10 RUN_B=6 RESERVE_A=140 RESERVE_B=35
fi
MACHINE="$WORK/machine.json"
DATA="$WORK/papers"
B=benchmarks/gnn

step preflight 10 bash -c "nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1; df -h '$WORK'; \
  free -g; nproc; cat /proc/sys/vm/dirty_ratio; test -w /proc/sys/vm/drop_caches && echo drop_caches writable"
step calibrate 25 $PY -m carina gnn calibrate "$WORK" --device "$DEVICE" --size-mb "$CAL_MB" --out "$MACHINE"
[ -f "$MACHINE" ] && cp "$MACHINE" "$OUT/gnn/machine_$TAG.json"
step read-path 40 $PY $B/bench_read_path.py --data "$WORK/rp" --nodes "$RP_NODES" --batches 4 --gaps 0,4 \
  --name "gnn_read_path_$TAG"
rm -rf "$WORK/rp"
gen() {  # gen NODES LIMIT: generate the papers-like dataset, timed
  rm -rf "$DATA"
  step "prepare-$1" "$2" $PY -m carina gnn prepare "$DATA" --nodes "$1" --dim 128 --avg-degree 15 \
    --train-fraction 0.01 --device "$DEVICE"
}
gen "$NODES" 150
if [ ! -f "$DATA/manifest.json" ]; then
  echo "== 2^26 nodes did not generate: falling back to $NODES_SMALL" | tee -a "$LOG"
  gen "$NODES_SMALL" $(( $(left) - RESERVE_A - RESERVE_B ))
fi
MOPT=()
[ -f "$MACHINE" ] && MOPT=(--machine "$MACHINE")
COMMON=(--data "$DATA" --hidden "$HIDDEN" --warmup 1 --budgets 0,0.25,0.5,0.75,1.0 --peer-budget 0.5
  --features-from generator --peer-seed-offset 1 --device "$DEVICE" "${MOPT[@]}")
if [ -f "$DATA/manifest.json" ]; then
  LIM=$(( $(left) - RESERVE_A ))
  step fanout-25x10 "$LIM" $PY $B/bench_outofcore.py "${COMMON[@]}" --fanouts 25,10 --batch-size "$BATCH_A" \
    --batches 20 --run-seconds "$RUN_A" --deadline-s $(( LIM - 15 )) --name "gnn_outofcore_papers_25x10_$TAG"
  LIM=$(( $(left) - RESERVE_B ))
  step fanout-15x10x5 "$LIM" $PY $B/bench_outofcore.py "${COMMON[@]}" --fanouts 15,10,5 --batch-size "$BATCH_B" \
    --batches 30 --run-seconds "$RUN_B" --deadline-s $(( LIM - 10 )) --skip ablations \
    --name "gnn_outofcore_papers_15x10x5_$TAG"
  if [ -f "$MACHINE" ]; then
    COLUMNS=160 step plan 30 $PY -m carina gnn plan "$DATA" --machine "$MACHINE" --device "$DEVICE" \
      --fanouts 25,10 --batch-size "$BATCH_A" --gpu-mem-gb 16 --host-mem-gb 32 --max-ssds 4
  fi
fi
# summary: key figures of the records written above (reads them only)
timeout 15 $PY - "$OUT/gnn" "$TAG" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path

out, tag = Path(sys.argv[1]), sys.argv[2]
for p in sorted(out.glob(f"*_{tag}.json")):
    r = json.loads(p.read_text())
    if "figures" not in r:
        continue
    m = r.get("metrics", {})
    print(f"-- {r['name']}")
    for f in r.get("figures", []):
        print(f"   {f['name']:44s} {f['value']:>14.4g} {f['unit']}")
    for k in ("skipped", "recommended", "rows_exact_vs_generator", "file_matches_generator_on_4096_rows"):
        if m.get(k) is not None:
            print(f"   {k}: {json.dumps(m[k])[:300]}")
    cold = m.get("systems", {}).get("mmap", {}).get("cold")
    if cold:
        print(f"   mmap cold: {cold}")
EOF
echo "== lane done in $(( $(date +%s) - start )) s, status $status" | tee -a "$LOG"
exit $status
