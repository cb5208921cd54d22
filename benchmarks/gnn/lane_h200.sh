#!/usr/bin/env bash
# carina.gnn device lane for one H200 (141 GB, 16 cores, 125 GB RAM, ~64 GB free virtio disk at ~1.5 GB/s,
# PCIe ~54 GB/s). SESSION names the records (gnn_*_h200_$SESSION; default s13). The session-11 form of this
# lane ran at acec381 in session 12 (records gnn_outofcore_*_h200_s11, benchmarks/gnn/h200/s11/run.json, 247 s of
# the 390 s budget); this session-13 form runs the same systems and adds what those records left open:
#   * the sampler thread's device time: every pipelined run now records sample_device_ms and lookup_device_ms
#     (CUDA events on the sampler's own stream, read lazily: carina.gnn.sidestream.StageEvents) beside its CPU
#     timers sample_cpu_ms and lookup_cpu_ms; s11's papers-like sample+lookup was 15.5 ms a batch with the
#     cache at 100% against 8.8 in memory on the CPU's clock, which holds the waits for queued GPU work;
#   * a warm-up read before the first timed papers-like system (--warm-read-batches WARM_A, batches of their
#     own seed, untimed, metrics.warm_read): in s11 the pick ran first and its read stage took 959.7 ms a call
#     against 726.0 ms for the same batches run again at the end;
#   * as in s11: carina at 100% cache with the host path the cost model picks and with the other one, the
#     sampler on its own stream against the device's (in-memory one-stream), at 50% the pick, gap 0 and no
#     pipelining, then the pick again; calibration as in s11.
# Dropped for room: bench_gather_rate (run in s12: gnn_gather_rate_h200_s11); gap x4 stays out (as in s11).
# In-memory runs first and last; host-gather, zero-copy, mmap, sync-reads and the read path ran in s8/s9
# and are left out. HARD BUDGET: BUDGET_S (default 390 s) + <= 8 s of summary: give the call 400 s.
# Every step runs under `timeout`, each limit clipped to what is left (benchmarks/ckpt/budget_steps.sh: a
# step with < 5 s left is skipped and logged); the papers-like steps leave RESERVE_IGB s for the IGB-like
# ones, and bench_outofcore's --deadline-s skips systems that no longer fit (named in `skipped`).
# Steps (s11's times, from its log, in brackets):
#   1. preflight; PyG importable, else installed from the carried .whl-gnn                        [11 s]
#   2. calibrate, 512 MB scratch, queue depth 128                                     (<=30 s)  [6 s]
#   3. prepare papers-like, 2^26 nodes, 128-d fp32 (32 GiB + 4.5 GB topology)          (<=90 s) [39 s]
#   4. bench papers-like [25,10] @ 8000: a warm-up read of WARM_A (2) batches, then in-memory, in-memory
#      one-stream, carina@0.5, carina@1, the other host path at 1, gap 0 and no pipelining at 0.5, the pick
#      again, in-memory again; 6 s per system (rest - RESERVE_IGB, 140 s)                      [78 s + warm read]
#   5. plan papers-like, 5.7 GB GPU + 11.5 GB host, no reserves                                    [<1 s]
#   6. delete papers-like, prepare IGB-like, 8M nodes, 1024-d fp32 (32 GiB)            (<=70 s) [34 s]
#   7. bench IGB-like [15,10,5] @ 1024: in-memory, in-memory one-stream, carina@1, the other host path,
#      carina@1 again, in-memory again (100% is the peer budget here; no disk reads, no warm-up read)
#                                                                                   (rest - 15 s) [40 s]
#   8. plan IGB-like, the same memory
#   9. the gpu-marked tests of the host paths and of the sampler's device times, if >= 30 s are left and
#      pytest is there                                                                        (<=25 s) [17 s]
# Records (JSON) go to $OUT/gnn/ as each step ends; log.txt has every step's output.
# Usage (repository root): OUT=<dir> bash benchmarks/gnn/lane_h200.sh
#   carry .whl-gnn (bash benchmarks/gnn/fetch_h200_carry.sh) in case the image lacks torch_geometric
#   via the combined driver: OUT=$OUT bash benchmarks/h100_combined.sh gnn=benchmarks/gnn/lane_h200.sh:400
# Proof on CPU (tiny sizes, on the 2-core machine): DEVICE=cpu OUT=/tmp/gnn_lane bash benchmarks/gnn/lane_h200.sh
set -u
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/gnn"
BUDGET_S=${BUDGET_S:-390}
SESSION=${SESSION:-s13}
mkdir -p "$OUT/gnn"
LOG="$OUT/gnn/log.txt"
: >"$LOG"
WORK=${WORK:-$PWD/.gnn_lane}
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
status=0
# shellcheck source=../ckpt/budget_steps.sh
. benchmarks/ckpt/budget_steps.sh
if [ "$DEVICE" = cpu ]; then
  TAG=cpu_$SESSION P_NODES=16384 P_SMALL=8192 I_NODES=4096 I_SMALL=2048 BATCH_A=256 BATCH_B=64 HIDDEN=32
  CAL_MB=32 RUN_A=3 RUN_B=3 RESERVE_IGB=120 TRAIN_FRAC=0.25 WARM_A=1  # several batches per epoch at tiny sizes
else
  TAG=${GPU_TAG:-h200}_$SESSION P_NODES=67108864 P_SMALL=33554432 I_NODES=8388608 I_SMALL=4194304 BATCH_A=8000
  BATCH_B=1024 HIDDEN=256 CAL_MB=512 RUN_A=6 RUN_B=6 RESERVE_IGB=140 TRAIN_FRAC=0.01 WARM_A=2  # ~84 / ~82 batches
fi
MACHINE="$WORK/machine.json"
B=benchmarks/gnn

pyg_check() {  # PyG's layers importable; else install the carried wheels (only what the image lacks)
  $PY -c "import torch_geometric; print('torch_geometric', torch_geometric.__version__)" && return 0
  ls .whl-gnn/torch_geometric-*.whl >/dev/null 2>&1 || { echo "no torch_geometric and no .whl-gnn"; return 1; }
  PIP_BREAK_SYSTEM_PACKAGES=1 $PY -m pip install -q --no-index --find-links .whl-gnn torch_geometric ||
    { $PY -m pip install -q --no-index --no-deps --target /tmp/site-gnn .whl-gnn/*.whl &&
      echo "PYTHONPATH_ADD=/tmp/site-gnn"; }
  PYTHONPATH=$PYTHONPATH:/tmp/site-gnn $PY -c "import torch_geometric; print('installed', torch_geometric.__version__)"
}
export PY
export -f pyg_check
step preflight 10 bash -c "nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1; df -h '$WORK'; \
  free -g; nproc; test -w /proc/sys/vm/drop_caches && echo drop_caches writable"
step pyg 40 bash -c pyg_check
grep -q "PYTHONPATH_ADD=/tmp/site-gnn" "$LOG" && export PYTHONPATH=$PYTHONPATH:/tmp/site-gnn
step calibrate 30 $PY -m carina gnn calibrate "$WORK" --device "$DEVICE" --size-mb "$CAL_MB" --queue-depth 128 \
  --out "$MACHINE"
[ -f "$MACHINE" ] && cp "$MACHINE" "$OUT/gnn/machine_$TAG.json"
MOPT=()
[ -f "$MACHINE" ] && MOPT=(--machine "$MACHINE")

prepare() {  # prepare DIR NODES LIMIT EXTRA...: generate a dataset (timed, inside the budget)
  local dir=$1 nodes=$2 limit=$3
  shift 3
  rm -rf "$dir"
  step "prepare-$(basename "$dir")-$nodes" "$limit" $PY -m carina gnn prepare "$dir" --nodes "$nodes" \
    --train-fraction "$TRAIN_FRAC" --device "$DEVICE" "$@"
}
dataset() {  # dataset DIR NODES SMALL LIMIT RESERVE EXTRA...: full size, else half size if time allows
  local dir=$1 nodes=$2 small=$3 limit=$4 reserve=$5
  shift 5
  prepare "$dir" "$nodes" "$limit" "$@"
  if [ ! -f "$dir/manifest.json" ] && [ $(( $(left) - reserve )) -ge 60 ]; then
    echo "== $nodes nodes did not generate: falling back to $small" | tee -a "$LOG"
    prepare "$dir" "$small" $(( $(left) - reserve - 40 )) "$@"
  fi
}
bench() {  # bench NAME DATA FANOUTS BATCH RUN_S RESERVE BUDGETS PEER_BUDGET SKIP WARM: the systems in one time-boxed run
  local name=$1 data=$2 fanouts=$3 batch=$4 run_s=$5 reserve=$6 budgets=$7 pb=$8 skip=$9 warm=${10} lim
  lim=$(( $(left) - reserve ))
  step "$name" "$lim" $PY $B/bench_outofcore.py --data "$data" --hidden "$HIDDEN" --warmup 1 --host-gather model \
    --budgets "$budgets" --skip "$skip" --peer-budget "$pb" --features-from generator --peer-seed-offset 1 \
    --device "$DEVICE" "${MOPT[@]}" --fanouts "$fanouts" --batch-size "$batch" --batches 20 \
    --run-seconds "$run_s" --deadline-s $(( lim - 25 )) --workload-out "$OUT/gnn/workload_${name}.json" \
    --warm-read-batches "$warm" --name "$name"
}
plan() {  # plan NAME GPU_GB HOST_GB: the cost model's plan from the workload the bench profiled
  local w="$OUT/gnn/workload_$1.json"
  [ -f "$MACHINE" ] && [ -f "$w" ] || { echo "== plan $1: no machine or workload, skipped" | tee -a "$LOG"; return; }
  COLUMNS=160 step "plan-$1" 15 $PY -m carina gnn plan --machine "$MACHINE" --workload "$w" \
    --gpu-mem-gb "$2" --host-mem-gb "$3" --max-ssds 6 --gpu-reserve-gb 0 --host-reserve-gb 0
  timeout 10 $PY -m carina gnn plan --machine "$MACHINE" --workload "$w" --gpu-mem-gb "$2" --host-mem-gb "$3" \
    --max-ssds 6 --gpu-reserve-gb 0 --host-reserve-gb 0 --json >"$OUT/gnn/plan_$1.json" 2>>"$LOG"
}

PAPERS="$WORK/papers" IGB="$WORK/igb"
P_NAME="gnn_outofcore_papers_25x10_$TAG" I_NAME="gnn_outofcore_igb_15x10x5_$TAG"
PEERS=mmap,sync-reads,host-gather,zero-copy
dataset "$PAPERS" "$P_NODES" "$P_SMALL" 90 "$RESERVE_IGB" --dim 128 --avg-degree 15 --gamma 2.1 --classes 16
if [ -f "$PAPERS/manifest.json" ]; then
  bench "$P_NAME" "$PAPERS" 25,10 "$BATCH_A" "$RUN_A" "$RESERVE_IGB" 0.5,1.0 0.5 "$PEERS,ablations gap x4" \
    "$WARM_A"
  plan "$P_NAME" 5.7 11.5
fi
rm -rf "$PAPERS"
dataset "$IGB" "$I_NODES" "$I_SMALL" 70 60 --dim 1024 --avg-degree 14.4 --gamma 2.3 --classes 19
if [ -f "$IGB/manifest.json" ]; then
  bench "$I_NAME" "$IGB" 15,10,5 "$BATCH_B" "$RUN_B" 15 1.0 1.0 \
    "$PEERS,ablations no-hole-coalescing,ablations gap x4,ablations no-pipelining" 0
  plan "$I_NAME" 5.7 11.5
fi
rm -rf "$IGB"
# the gpu-marked tests of the host paths (mapped pinned slice, bit-exact rows), with what is left
GPU_TESTS="tests/gnn/test_store.py tests/memory/test_mapped.py tests/gnn/test_costmodel.py tests/gnn/test_train.py
  tests/gnn/test_hostread.py"
# (test_train.py holds the gpu test of the sampler's device times: positive, and within the epoch's wall time)
if [ "$DEVICE" != cpu ] && [ "$(left)" -ge 30 ] && $PY -c "import pytest, hypothesis" 2>/dev/null; then
  step gpu-tests 25 $PY -m pytest -q -m gpu -p no:cacheprovider $GPU_TESTS
else
  echo "== gpu-tests: skipped (cpu, $(left) s left, or no pytest/hypothesis)" | tee -a "$LOG"
fi
# summary: key figures of the records written above (reads them only)
timeout 8 $PY - "$OUT/gnn" "$TAG" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path

out, tag = Path(sys.argv[1]), sys.argv[2]
for p in sorted(out.glob(f"gnn_*_{tag}.json")):
    r = json.loads(p.read_text())
    if "figures" not in r:
        continue
    m = r.get("metrics", {})
    print(f"-- {r['name']}")
    for f in r.get("figures", []):
        print(f"   {f['name']:44s} {f['value']:>14.4g} {f['unit']}")
    for k, v in m.get("systems", {}).items():
        print(f"   system {k:37s} {v['seeds_per_s']:>14.4g} seeds/s  ({v.get('rate_basis', '')[:60]})")
    for k in ("skipped", "warm_read", "recommended_by_budget", "rows_exact_vs_generator",
              "file_matches_generator_on_4096_rows"):
        if m.get(k) is not None:
            print(f"   {k}: {json.dumps(m[k])[:300]}")
    sc = m.get("stage_check")
    if sc:
        print(f"   stage predictions within 15%: {sc['within']} of {sc['pairs']}, own-timer {sc.get('within_own')} of {sc.get('own')}")
    runs = m.get("systems", {}) | {f"carina@{k}": v for k, v in m.get("carina", {}).items()}
    runs |= {f"carina {k}": v for k, v in m.get("ablations", {}).items()}
    ms = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for k, v in runs.items():  # the sampler thread a batch: CPU clock | device (CUDA events on its stream)
        if "sample_cpu_ms" in v:
            print(f"   sampler ms {k:29s} sample {ms(v['sample_cpu_ms'])} | {ms(v['sample_device_ms'])}, "
                  f"lookup {ms(v['lookup_cpu_ms'])} | {ms(v['lookup_device_ms'])}")
    for k, v in (m.get("carina", {}) | m.get("ablations", {})).items():
        print(f"   {k:30s} host gather {v.get('host_gather')}, predicted {v['predicted']['seeds_per_s']:.0f} seeds/s")
    cold = m.get("systems", {}).get("mmap", {}).get("cold")
    if cold:
        print(f"   mmap cold: {cold}")
EOF
echo "== lane done in $(( $(date +%s) - start )) s, status $status" | tee -a "$LOG"
exit $status
