#!/usr/bin/env bash
# carina.gnn, second H100 session. Hard budget: 150 s of run time in total (sum of the step timeouts:
# calibrate 15 + determinism 60 + IGB-like 50 + placement e2e 25).
#   1. calibrate the machine (disk IOPS/bandwidth, pinned H2D, gathers) -> /tmp (not a record)
#   2. bench_determinism: in-memory vs out-of-core losses, default CUDA kernels and deterministic mode
#      (2M-node papers-like graph, 128-d, batch 1024, fan-out [10,5], as the first H100 record; its
#      carina seeds/s re-measure that record with hole merging on)
#   3. bench_outofcore --preset igb-like: 512k nodes, 1024-d fp32 (one 4 KiB page per row, 2 GB), default kernels
#   4. bench_placement_e2e: the placement LP's batch transfer time from calibrated links vs measured
# Writes at most 5 files to $OUT/gnn/: log.txt, the calibration (machine_<tag>.json) and three JSON records.
# Each benchmark writes its record into $OUT/gnn/ (CARINA_RESULTS_DIR) as soon as its step ends, and prints
# its key figures into log.txt; the summary at the end only reads those files.
# Usage (repository root): OUT=<dir> bash benchmarks/gnn/h100_s2.sh
# GPU_TAG names the records (default h100; the device driver sets it from nvidia-smi); STEPS="determinism
# placement-e2e" leaves the IGB-like step out (calibrate, determinism and placement-e2e always run).
# Proof on CPU (tiny sizes):  DEVICE=cpu OUT=/tmp/gnn_out PYTHON=.venv/bin/python bash benchmarks/gnn/h100_s2.sh
set -u
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/gnn" CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p "$OUT/gnn"
LOG="$OUT/gnn/log.txt"
WORK=${WORK:-/tmp/carina-gnn-s2}
mkdir -p "$WORK"
if [ "$DEVICE" = cpu ]; then  # the CPU proof runs on a shared 2-core machine: tiny sizes, 3x the time limits
  TAG=cpu_s2 P_NODES=16384 P_BATCH=128 P_HIDDEN=32 I_NODES=4096 I_BATCH=32 BATCHES=4 CAL_MB=32 SCALE=3
else
  TAG=${GPU_TAG:-h100} P_NODES=2097152 P_BATCH=1024 P_HIDDEN=256 I_NODES=524288 I_BATCH=256 BATCHES=6 CAL_MB=256 SCALE=1
fi
MACHINE="$WORK/machine.json"
step() {  # step <name> <timeout s> <command...>
  local name=$1 limit=$(( $2 * SCALE )) t0 rc
  shift 2
  t0=$(date +%s)
  echo "=== $name (timeout ${limit}s): $*" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  echo "=== $name rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
}
: > "$LOG"
step calibrate 15 $PY -m carina gnn calibrate "$WORK" --device "$DEVICE" --size-mb "$CAL_MB" --out "$MACHINE"
[ -f "$MACHINE" ] && cp "$MACHINE" "$OUT/gnn/machine_$TAG.json"  # kept with the records (each record embeds it too)
MOPT=()
[ -f "$MACHINE" ] && MOPT=(--machine "$MACHINE")
step determinism 60 $PY benchmarks/gnn/bench_determinism.py --data "$WORK/papers" --nodes "$P_NODES" --dim 128 \
  --fanouts 10,5 --batch-size "$P_BATCH" --hidden "$P_HIDDEN" --batches "$BATCHES" --warmup 1 --budgets 0.2,0.6 \
  --device "$DEVICE" "${MOPT[@]}" --name "gnn_determinism_$TAG"
[[ " ${STEPS:-determinism igb-like placement-e2e} " == *" igb-like "* ]] && step igb-like 50 $PY benchmarks/gnn/bench_outofcore.py --preset igb-like --data "$WORK/igb" --nodes "$I_NODES" \
  --fanouts 10,5 --batch-size "$I_BATCH" --hidden "$P_HIDDEN" --batches "$BATCHES" --warmup 1 --budgets 0.2 \
  --skip mmap,ablations --device "$DEVICE" "${MOPT[@]}" --name "gnn_outofcore_igb_$TAG"
if [ -f "$MACHINE" ] && [ -f "$WORK/papers/manifest.json" ]; then
  step placement-e2e 25 $PY benchmarks/gnn/bench_placement_e2e.py --data "$WORK/papers" --machine "$MACHINE" \
    --fanouts 10,5 --batch-size "$P_BATCH" --batches "$BATCHES" --cache 0.2 --device "$DEVICE" \
    --name "gnn_placement_e2e_$TAG"
fi
$PY - "$OUT/gnn" "$TAG" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path

out, tag = Path(sys.argv[1]), sys.argv[2]
def load(name):
    p = out / f"{name}_{tag}.json"
    return json.loads(p.read_text()) if p.is_file() else None

print(f"{'check':44s} {'result':>40s}")
det = load("gnn_determinism")
if det:
    for mode, runs in det["metrics"]["modes"].items():
        if "error" in runs:
            print(f"{mode:44s} {runs['error'][:40]:>40s}")
            continue
        for k, v in runs.items():
            if k != "in-memory":
                res = f"equal={v['losses_equal']} rows={v['rows_equal']} diff={v['max_abs_loss_diff']:.2e}"
                print(f"{mode + ' ' + k:44s} {res:>40s}")
    for f in det["figures"]:
        if f["name"].startswith("seeds_per_s"):
            print(f"{'papers-like ' + f['name']:44s} {f['value']:>34.0f} seeds/s")
else:
    print("determinism: no record")
igb = load("gnn_outofcore_igb")
if igb:
    m = igb["metrics"]
    for f in igb["figures"]:
        print(f"{'igb-like ' + f['name']:44s} {f['value']:>34.0f} seeds/s")
    print(f"{'igb-like in-memory / sync-reads seeds/s':44s} "
          f"{m['systems']['in-memory']['seeds_per_s']:>19.0f} / {m['systems']['sync-reads']['seeds_per_s']:.0f}")
    print(f"{'igb-like losses equal (all systems)':44s} {str(all(m['losses_equal_to_in_memory'].values())):>40s}")
else:
    print("igb-like: no record")
e2e = load("gnn_placement_e2e")
if e2e:
    r = e2e["metrics"]["measured_over_predicted"]
    f = e2e["figures"][0]
    pred = list(f["peers"].values())[0]["value"]
    res = f"{f['value']:.1f} ms vs LP {pred:.1f} ms (x{r['mean']:.2f})"
    print(f"{'placement e2e measured vs predicted':44s} {res:>40s}")
else:
    print("placement e2e: no record")
EOF
