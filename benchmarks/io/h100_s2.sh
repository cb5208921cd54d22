#!/usr/bin/env bash
# carina.io on the H100 machine (third device session). HARD TIME BUDGET: BUDGET_S (default 150 s) of run
# time in all; give this lane a limit of at least BUDGET_S + 10 s (or set BUDGET_S to the limit - 10).
# Each step runs under `timeout` with min(its maximum, what is left) and is SKIPPED when less than its
# minimum is left, so a step never starts that cannot finish. Each step writes its own record straight into
# $OUT/io/ the moment it ends (never to /tmp, never gathered at the end) and prints its key figures.
# Steps, in priority order (maximum / minimum seconds; what the last call measured goes last):
#   1. gemm_bf16 (45/30): out-of-core GEMM n=12288 tile 4096 bf16, ceiling = fio direct=1 on the same two files
#   2. gemm_tf32 (50/35): the same in fp32 operands with TF32 matmuls
#   3. cam (35/25): GPU-initiated gathers (CamGather: cuStreamWriteValue32 doorbell, cuStreamWaitValue32
#      release) against host-initiated gathers, 64 batches of 1024 rows
#   4. kvikio (20/10): the kvikio backend's conformance tests, from the wheels in WHL_IO (default .whl-io)
#   5. randread (40/35): 4 KiB random reads, carina (uring) vs fio in 4 interleaved 1 s pairs, QD32 and QD128
#      (took 28 s in the last call; measured there: h100/io_randread_h100.json)
#   6. sort (50/40): external sort, 2 GB of uint64 under a 512 MB budget, with the synchronous peer
#      (took 33 s in the last call; measured there: h100/io_sort_h100_s2.json)
# The worst case of steps 1-4 is 150 s; 5 and 6 run only with what is left (a longer BUDGET_S gets them).
# fio: taken from PATH; else from Debian packages in FIO_DEBS (default .debs-io, carried), unpacked to /tmp;
# else the steps say "fio not installed" and use threaded O_DIRECT reads (step 5 then has no ceiling).
# Files in $OUT/io/ (at most 7): one <record>.json per step that finished, io_s2.log (all output).
# Usage (repository root): OUT=<dir> bash benchmarks/io/h100_s2.sh ; CPU proof: DEVICE=cpu OUT=/tmp/io_out bash ...
set -uo pipefail
: "${OUT:?set OUT}"
BUDGET_S=${BUDGET_S:-150}
DEVICE=${DEVICE:-cuda}
SCRATCH=${SCRATCH:-.}
PYTHON=${PYTHON:-python3}
FIO_DEBS=${FIO_DEBS:-.debs-io}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
REC="$OUT/io"
mkdir -p "$REC"
LOG="$REC/io_s2.log"
exec > >(tee "$LOG") 2>&1
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
step() {  # step NAME MIN_S MAX_S CMD...: timeout min(MAX_S, budget left); skipped when < MIN_S are left
  local name=$1 min=$2 max=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then echo "== $name: SKIPPED ($l s left, needs $min s)"; return; fi
  [ "$max" -gt "$l" ] && max=$l
  echo "== $name (timeout $max s, t=$(($(date +%s) - start)) s)"
  timeout -k 5 "$max" "$@"; local rc=$?
  echo "== $name rc=$rc after $(($(date +%s) - start)) s; records in $REC: $(cd "$REC" && ls ./*.json 2>/dev/null | wc -l)"
}

if [ "$DEVICE" = cpu ]; then  # tiny sizes: proves the script, not the machine
  RR="--size 64M --depths 32 --pairs 1 --seconds 1"
  GEMM="--n 512 --tile 128 --ceiling-seconds 1"
  SORT="--size 32M --budget 8M --ceiling-seconds 1"
  CAM="--file-size 16M --rows 128 --batches 8 --work 2"
else
  RR="--size 1G --depths 32,128 --pairs 4 --seconds 1"
  GEMM="--n 12288 --tile 4096 --ceiling-seconds 2"
  SORT="--size 2G --budget 512M --ceiling-seconds 2"
  CAM="--file-size 512M --rows 1024 --batches 64 --work 200"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
fi
FIO=${FIO-$(command -v fio || true)}
if [ -z "$FIO" ] && ls "$FIO_DEBS"/fio_*.deb >/dev/null 2>&1; then
  P=$(mktemp -d /tmp/carina-fio-XXXX)
  for f in "$FIO_DEBS"/*.deb; do dpkg-deb -x "$f" "$P" 2>/dev/null || dpkg -x "$f" "$P"; done
  cat > "$P/fio.sh" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu:$P/usr/lib/x86_64-linux-gnu/ceph exec $P/usr/bin/fio "\$@"
EOF
  chmod +x "$P/fio.sh"
  "$P/fio.sh" --version && FIO="$P/fio.sh" || FIO=""
fi
if [ -n "$FIO" ]; then echo "fio: $FIO ($("$FIO" --version))"; FIOARG=(--fio "$FIO"); else
  echo "fio: NOT INSTALLED (no fio on PATH, no $FIO_DEBS): randread has no ceiling; gemm and sort use threaded O_DIRECT"
  FIOARG=(--fio none); fi
df -h "$SCRATCH" | tail -1

# shellcheck disable=SC2086
step gemm_bf16 30 45 "$PYTHON" benchmarks/io/bench_gemm.py --device "$DEVICE" $GEMM --dtypes bf16 --dir "$SCRATCH" \
  "${FIOARG[@]}" --name io_gemm_bf16_h100_s3 --out "$REC"
# shellcheck disable=SC2086
step gemm_tf32 35 50 "$PYTHON" benchmarks/io/bench_gemm.py --device "$DEVICE" $GEMM --dtypes fp32 --dir "$SCRATCH" \
  "${FIOARG[@]}" --name io_gemm_tf32_h100_s3 --out "$REC"
# shellcheck disable=SC2086
step cam 25 35 env CUDA_MODULE_LOADING=EAGER "$PYTHON" benchmarks/io/bench_cam.py --device "$DEVICE" $CAM \
  --dir "$SCRATCH" --name io_cam_h100 --out "$REC"
kvikio_step() {  # the kvikio backend through the conformance suite, from wheels in WHL_IO (carried), if any
  if ! ls "$WHL_IO"/kvikio_*.whl >/dev/null 2>&1; then echo "kvikio: no wheels in $WHL_IO: skipped"; return 0; fi
  local T; T=$(mktemp -d /tmp/carina-kvikio-XXXX)
  for w in "$WHL_IO"/*.whl; do "$PYTHON" -m zipfile -e "$w" "$T" || return 1; done  # a wheel is a zip: no pip
  export PYTHONPATH="$PYTHONPATH:$T" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$T/nvidia/cu13/lib"
  "$PYTHON" -c "from carina.io.backends.kvikio import KvikioBackend as K; print('kvikio backend reasons:', K.probe_reasons())"
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/io/test_io_kvikio.py 2>&1 | tail -5
}
WHL_IO=${WHL_IO:-.whl-io}
step kvikio 10 20 bash -c "$(declare -f kvikio_step); PYTHON=$PYTHON WHL_IO=$WHL_IO PYTHONPATH=$PYTHONPATH kvikio_step"
# shellcheck disable=SC2086
step randread 35 40 "$PYTHON" benchmarks/io/bench_randread.py $RR --dir "$SCRATCH" "${FIOARG[@]}" \
  --name io_randread_h100_s3 --out "$REC"
# shellcheck disable=SC2086
step sort 40 50 "$PYTHON" benchmarks/io/bench_sort.py --device "$DEVICE" $SORT --dir "$SCRATCH" "${FIOARG[@]}" \
  --name io_sort_h100_s3 --out "$REC"

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
echo "io s2 done after $(($(date +%s) - start)) s (budget $BUDGET_S s)"
