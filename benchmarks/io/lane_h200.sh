#!/usr/bin/env bash
# carina.io on the H200 machine. HARD TIME BUDGET: BUDGET_S (default 300 s) of run time in all; give the lane
# a limit of at least BUDGET_S + 10 s (benchmarks/h100_combined.sh io=benchmarks/io/lane_h200.sh:310).
# Each step runs under `timeout` with min(its maximum, what is left) and is SKIPPED when less than its
# minimum is left, so a step never starts that cannot finish. Each step writes its own record straight into
# $OUT/io/ the moment it ends and prints its key figures to the log.
# Steps, in order (maximum / minimum seconds):
#   1. pairs (45/30): fio vs carina (uring), interleaved 1 s pairs on one 1 GB file: 4 KiB random reads at
#      QD32 and QD128, 1 MiB sequential reads at QD32 -> io_randread_h200.json
#   2. gemm_bf16 (45/30): out-of-core GEMM n=12288 tile 4096 bf16 (A+B 0.6 GB against a 352 MB device
#      budget), synchronous peer in the record, ceiling = fio direct=1 on the same two files -> io_gemm_bf16_h200
#   3. gemm_tf32 (50/35): the same in fp32 operands with TF32 matmuls (1.2 GB against 512 MB) -> io_gemm_tf32_h200
#   4. cam (50/35): GPU-initiated gathers (CamGather: cuStreamWriteValue32 doorbell, cuStreamWaitValue32
#      release) against host-initiated gathers, 64 batches of 1024 rows of 4 KiB, 5 rounds of the four passes
#      (medians, every round kept, verdict beyond/inside noise), both paths through RowGather; each pass named
#      on stderr as it starts, a pass past 12 s dumps every thread's stack and exits 1 -> io_cam_h200
#   5. fio_buffers (25/18, needs fio): fio with 4 KiB-page against huge-page buffers, 1 MiB / 4 MiB / 4 KiB reads,
#      device requests per read and the disk's limits (why the session-5 ceilings read low) -> io_fio_buffers_h200
#   6. kvikio (40/10): the kvikio backend's conformance tests against real KvikIO (the stand-in class runs in
#      CI) and 1 MiB reads vs fio, from the wheels in $CARRY/whl (made by benchmarks/io/fetch_h200_carry.sh)
#      -> io_kvikio_h200, or a log line saying absent
#   6b. gputests (40/10): the gpu-marked tests of RowGather and CamGather, verbose, a stuck test's stacks dumped
#      at 15 s (log only, no record)
#   7. pairs_posix (20/15): the same pairs through the posix backend (one thread per queue slot), 4 KiB QD32
#      and 1 MiB QD32 -> io_randread_posix_h200.json
#   8. batching (25/15, needs fio): why a fixed queue depth loses IOPS to batches: completion times of 8/32/128
#      reads submitted at once, fio in whole-queue convoys vs its staggered loop at QD32 -> io_batching_h200.json
#   9. sort (rest, >= 25): external sort, no synchronous peer, the largest of 16/8/4/2/1 GB (budget a quarter)
#      that the time left and the free disk allow (about 9 s per GB) -> io_sort_h200
# fio: $CARRY/bin/fio (a static fio 3.33 built from Debian 12's source by fetch_h200_carry.sh), else fio on
# PATH, else none: step 1 then has no ceiling, 2 and 6 use threaded O_DIRECT reads.
# Huge pages: HUGEPAGES (default 160 x 2 MiB) are reserved in /proc/sys/vm/nr_hugepages for fio's buffers
# (--iomem=mmaphuge; carina's large buffers are transparent huge pages) and the old value is restored at the
# end; HUGEPAGES=0 reserves none (fio then uses 4 KiB pages and every ceiling_source says so).
# Files in $OUT/io/ (at most 10): one <record>.json per step that finished, io_lane.log (all output).
# Usage (repository root): OUT=<dir> bash benchmarks/io/lane_h200.sh ; carry: .carry-io
# Some steps only: STEPS="gputests cam kvikio" BUDGET_S=140 OUT=<dir> bash benchmarks/io/lane_h200.sh (<= 40+50+40 s)
# CPU proof: DEVICE=cpu PYTHON=.venv/bin/python OUT=/tmp/io_out bash benchmarks/io/lane_h200.sh
set -uo pipefail
: "${OUT:?set OUT}"
BUDGET_S=${BUDGET_S:-300}
DEVICE=${DEVICE:-cuda}
SCRATCH=${SCRATCH:-.}
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.carry-io}
TAG=${GPU_TAG:-h200}
HUGEPAGES=${HUGEPAGES:-160}
STEPS=${STEPS:-}  # e.g. "cam kvikio": run only these steps (default: all)
[ "$DEVICE" = cpu ] && TAG=cpuproof  # record names say what made them
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
REC="$OUT/io"
mkdir -p "$REC"
LOG="$REC/io_lane.log"
exec > >(tee "$LOG") 2>&1
start=$(date +%s)
hp_before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
if [ "$HUGEPAGES" -gt "$hp_before" ] && { echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages; } 2>/dev/null; then
  trap 'echo "$hp_before" > /proc/sys/vm/nr_hugepages' EXIT
fi
echo "huge pages for fio: $(awk '/HugePages_Free/ {print $2}' /proc/meminfo) free (asked $HUGEPAGES, was $hp_before)"
# shellcheck source=benchmarks/lane_steps.sh
source benchmarks/lane_steps.sh  # left, step (the clock started above)

if [ "$DEVICE" = cpu ]; then  # tiny sizes: proves the script, not the machine
  PAIRS="--size 64M --cases rand4K@32,rand4K@128,seq1M@32 --pairs 1 --seconds 1"
  GEMM="--n 512 --tile 128 --ceiling-seconds 1"
  CAM="--file-size 16M --rows 128 --batches 8 --work 2 --repeats 2"
  FIOBUF="--size 64M --pairs 1 --seconds 1"
  KVREAD="--size 32M --cases seq1M@32 --pairs 1 --seconds 1"
  POSIX="--size 64M --cases rand4K@32,seq1M@32 --pairs 1 --seconds 1"
  BATCH="--size 64M --pairs 1 --trials 2"
  SORT_GB=(0.03125) SORT_PER_GB=200  # 32 MB
else
  PAIRS="--size 1G --cases rand4K@32,rand4K@128,seq1M@32 --pairs 4 --seconds 1"
  GEMM="--n 12288 --tile 4096 --ceiling-seconds 2"
  CAM="--file-size 512M --rows 1024 --batches 64 --work 200 --repeats 5"
  FIOBUF="--size 1G --pairs 2 --seconds 1"
  KVREAD="--size 1G --cases seq1M@32 --pairs 2 --seconds 1"
  POSIX="--size 1G --cases rand4K@32,seq1M@32 --pairs 2 --seconds 1"
  BATCH="--size 1G --pairs 4 --trials 8"
  SORT_GB=(16 8 4 2 1) SORT_PER_GB=9
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
fi
if [ "${FIO-unset}" = unset ]; then  # FIO="" means: no fio
  FIO=""
  [ -x "$CARRY/bin/fio" ] && FIO=$CARRY/bin/fio
  [ -z "$FIO" ] && FIO=$(command -v fio || true)
fi
if [ -n "$FIO" ] && "$FIO" --version >/dev/null 2>&1; then
  echo "fio: $FIO ($("$FIO" --version))"; FIOARG=(--fio "$FIO")
else
  echo "fio: NOT INSTALLED (no $CARRY/bin/fio, none on PATH): pairs have no ceiling; gemm and sort use threaded O_DIRECT"
  FIOARG=(--fio none)
fi
df -h "$SCRATCH" | tail -1

# shellcheck disable=SC2086
step pairs 30 45 "$PYTHON" benchmarks/io/bench_randread.py $PAIRS --dir "$SCRATCH" "${FIOARG[@]}" \
  --name "io_randread_$TAG" --out "$REC"
# shellcheck disable=SC2086
step gemm_bf16 30 45 "$PYTHON" benchmarks/io/bench_gemm.py --device "$DEVICE" $GEMM --dtypes bf16 --dir "$SCRATCH" \
  "${FIOARG[@]}" --name "io_gemm_bf16_$TAG" --out "$REC"
# shellcheck disable=SC2086
step gemm_tf32 35 50 "$PYTHON" benchmarks/io/bench_gemm.py --device "$DEVICE" $GEMM --dtypes fp32 --dir "$SCRATCH" \
  "${FIOARG[@]}" --name "io_gemm_tf32_$TAG" --out "$REC"
CAMDIR=$(mktemp -d "$SCRATCH/carina-cam-lane-XXXX")  # removed after the step: a stopped pass leaves its file
# shellcheck disable=SC2086
step cam 35 50 env CUDA_MODULE_LOADING=EAGER "$PYTHON" benchmarks/io/bench_cam.py --device "$DEVICE" $CAM \
  --pass-limit 12 --dir "$CAMDIR" --name "io_cam_$TAG" --out "$REC"
rm -rf "$CAMDIR"

if [ -n "$FIO" ]; then
  # shellcheck disable=SC2086
  step fio_buffers 18 25 "$PYTHON" benchmarks/io/bench_fio_buffers.py $FIOBUF --dir "$SCRATCH" --fio "$FIO" \
    --name "io_fio_buffers_$TAG" --out "$REC"
else echo "== fio_buffers: SKIPPED (no fio)"; fi

kvikio_step() {  # the kvikio backend: conformance, then 1 MiB reads against fio, from wheels in $CARRY/whl
  if ! ls "$CARRY"/whl/kvikio_*.whl >/dev/null 2>&1; then echo "kvikio: ABSENT (no wheels in $CARRY/whl): skipped"; return 0; fi
  local T; T=$(mktemp -d /tmp/carina-kvikio-XXXX)
  for w in "$CARRY"/whl/*.whl; do "$PYTHON" -m zipfile -e "$w" "$T" || return 1; done  # a wheel is a zip: no pip
  export PYTHONPATH="$PYTHONPATH:$T" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$T/libkvikio/lib64:$T/rapids_logger/lib64"
  "$PYTHON" -c "from carina.io.backends.kvikio import KvikioBackend as K; print('kvikio backend reasons:', K.probe_reasons())"
  "$PYTHON" -m pytest -q -p no:cacheprovider --tb=line -rfE -k "not StandIn" tests/io/test_io_kvikio.py 2>&1 | tail -30
  if ! "$PYTHON" -c "import sys; from carina.io.backends.kvikio import KvikioBackend as K; sys.exit(bool(K.probe_reasons()))"; then
    echo "kvikio: backend unavailable here: no read bench"; rm -rf "$T"; return 0; fi
  # shellcheck disable=SC2086
  "$PYTHON" benchmarks/io/bench_randread.py $KVREAD --backend kvikio --dir "$SCRATCH" "${FIOARG[@]}" \
    --name "io_kvikio_$TAG" --out "$REC"
  rm -rf "$T"
}
step kvikio 10 40 bash -c "$(declare -f kvikio_step); $(declare -p PYTHON CARRY KVREAD SCRATCH REC TAG FIOARG); kvikio_step"
# -v -s: each test's name as it starts; a test past 15 s dumps every thread's stack (faulthandler), and with
# pytest-timeout installed one past 25 s is stopped with the stacks dumped (thread method: works inside C calls)
PYTIMEOUT=()
"$PYTHON" -c "import pytest_timeout" 2>/dev/null && PYTIMEOUT=(--timeout=25 --timeout-method=thread)
step gputests 10 40 env CUDA_MODULE_LOADING=EAGER "$PYTHON" -m pytest -v -s -p no:cacheprovider --tb=short -rfEs -m gpu \
  -o faulthandler_timeout=15 ${PYTIMEOUT[@]+"${PYTIMEOUT[@]}"} tests/io/test_io_rows.py tests/io/test_io_cam.py

# shellcheck disable=SC2086
step pairs_posix 15 20 "$PYTHON" benchmarks/io/bench_randread.py $POSIX --backend posix --dir "$SCRATCH" "${FIOARG[@]}" \
  --name "io_randread_posix_$TAG" --out "$REC"

if [ -n "$FIO" ]; then
  # shellcheck disable=SC2086
  step batching 15 25 "$PYTHON" benchmarks/io/bench_batching.py $BATCH --dir "$SCRATCH" --fio "$FIO" \
    --name "io_batching_$TAG" --out "$REC"
else echo "== batching: SKIPPED (no fio)"; fi

sort_step() {  # the largest size in SORT_GB that the time left and the free disk (input + runs + output) allow
  local l avail gb
  l=$(left); avail=$(df --output=avail -B1G "$SCRATCH" | tail -1 | tr -d ' ')
  for gb in "${SORT_GB[@]}"; do
    if awk -v g="$gb" -v l="$l" -v a="$avail" -v p="$SORT_PER_GB" 'BEGIN{exit !(g*p+15 <= l && 3.5*g <= a)}'; then
      local size budget
      size=$(awk -v g="$gb" 'BEGIN{printf "%dM", g*1024}'); budget=$(awk -v g="$gb" 'BEGIN{printf "%dM", g*256}')
      echo "sort: $size under a $budget budget ($l s left, $avail GB free)"
      step sort 25 "$l" "$PYTHON" benchmarks/io/bench_sort.py --device "$DEVICE" --size "$size" --budget "$budget" \
        --no-peer --dir "$SCRATCH" "${FIOARG[@]}" --ceiling-seconds 2 --name "io_sort_$TAG" --out "$REC"
      return
    fi
  done
  echo "== sort: SKIPPED ($l s left, $avail GB free: not even ${SORT_GB[-1]} GB fits)"
}
sort_step

"$PYTHON" - "$REC" <<'EOF'
import json, pathlib, sys
recs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))]
print(f"\n{len(recs)} records in {sys.argv[1]}")
print(f"{'record':<22} {'figure':<26} {'value':>12} {'unit':<10} {'ceiling':>12} {'ratio':>6}  peers (carina/peer)")
for r in recs:
    for f in r["figures"]:
        ratio = f["ratio_to_ceiling"]
        peers = ", ".join(f"{k} {v['ratio']:.2f}x" for k, v in f["peers"].items() if v["ratio"])
        ceil = f"{f['ceiling']:.4g}" if f["ceiling"] else "-"
        print(f"{r['name']:<22} {f['name']:<26} {f['value']:>12.4g} {f['unit']:<10} {ceil:>12} "
              f"{(f'{ratio:.0%}' if ratio else '-'):>6}  {peers}")
EOF
echo "io lane done after $(($(date +%s) - start)) s (budget $BUDGET_S s)"
