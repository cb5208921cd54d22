#!/usr/bin/env bash
# carina.io, second H100 session. HARD TIME BUDGET: 100 s of run time in all (BUDGET_S); every step runs
# under `timeout` with at most what is left of it, in priority order:
#   1. 4 KiB random reads, carina (uring) vs fio in interleaved pairs, QD32 and QD128, O_DIRECT, same file
#   2. external sort, 2 GB of uint64 under a 512 MB budget (fixed merge), with the synchronous peer
#   3. out-of-core GEMM n=12288 tile 4096 bf16 + TF32, ceiling = fio direct=1 (or threads) on the same two files
#   4. GPU-initiated gathers (CamGather: cuStreamWriteValue32 doorbell, cuStreamWaitValue32 release) vs host-initiated
#   5. kvikio backend conformance tests, from the wheels in WHL_IO (default .whl-io, carried; ~6 MB), if present
# fio: taken from PATH; else from Debian packages in FIO_DEBS (default .debs-io, carried), unpacked to /tmp;
# else the steps say "fio not installed" and use threaded O_DIRECT reads (step 1 then has no ceiling).
# Files (at most 3) in $OUT/io/: io_s2_records.json (every record, a JSON list), io_s2.log (all output).
# Usage (repository root): OUT=<dir> bash benchmarks/io/h100_s2.sh ; CPU proof: DEVICE=cpu OUT=/tmp/io_out bash ...
set -uo pipefail
: "${OUT:?set OUT}"
BUDGET_S=${BUDGET_S:-100}
DEVICE=${DEVICE:-cuda}
SCRATCH=${SCRATCH:-.}
PYTHON=${PYTHON:-python3}
FIO_DEBS=${FIO_DEBS:-.debs-io}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p "$OUT/io"
RECS=$(mktemp -d /tmp/carina-io-s2-XXXX)
LOG="$OUT/io/io_s2.log"
exec > >(tee "$LOG") 2>&1
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
step() {  # step NAME MAX_S CMD...: run under timeout min(MAX_S, budget left); skip when < 5 s are left
  local name=$1 max=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 5 ]; then echo "== $name: SKIPPED (budget spent)"; return; fi
  [ "$max" -gt "$l" ] && max=$l
  echo "== $name (timeout $max s, t=$(($(date +%s) - start)) s)"
  timeout -k 5 "$max" "$@"; local rc=$?
  echo "== $name rc=$rc after $(($(date +%s) - start)) s"
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
  echo "fio: NOT INSTALLED (no fio on PATH, no $FIO_DEBS): no ceiling for step 1, threaded O_DIRECT for 2 and 3"
  FIOARG=(--fio none); fi
df -h "$SCRATCH" | tail -1

# shellcheck disable=SC2086
step randread 40 "$PYTHON" benchmarks/io/bench_randread.py $RR --dir "$SCRATCH" "${FIOARG[@]}" \
  --name io_randread_h100 --out "$RECS"
# shellcheck disable=SC2086
step sort 40 "$PYTHON" benchmarks/io/bench_sort.py --device "$DEVICE" $SORT --dir "$SCRATCH" "${FIOARG[@]}" \
  --name io_sort_h100_s2 --out "$RECS"
# shellcheck disable=SC2086
step gemm 30 "$PYTHON" benchmarks/io/bench_gemm.py --device "$DEVICE" $GEMM --dtypes bf16,fp32 --dir "$SCRATCH" \
  "${FIOARG[@]}" --name io_gemm_h100_s2 --out "$RECS"
# shellcheck disable=SC2086
step cam 25 env CUDA_MODULE_LOADING=EAGER "$PYTHON" benchmarks/io/bench_cam.py --device "$DEVICE" $CAM \
  --dir "$SCRATCH" --name io_cam_h100 --out "$RECS"
kvikio_step() {  # the kvikio backend through the conformance suite, from wheels in WHL_IO (carried), if any
  if ! ls "$WHL_IO"/kvikio_*.whl >/dev/null 2>&1; then echo "kvikio: no wheels in $WHL_IO: skipped"; return 0; fi
  local T; T=$(mktemp -d /tmp/carina-kvikio-XXXX)
  for w in "$WHL_IO"/*.whl; do "$PYTHON" -m zipfile -e "$w" "$T" || return 1; done  # a wheel is a zip: no pip
  export PYTHONPATH="$PYTHONPATH:$T" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$T/nvidia/cu13/lib"
  "$PYTHON" -c "from carina.io.backends.kvikio import KvikioBackend as K; print('kvikio backend reasons:', K.probe_reasons())"
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/io/test_io_kvikio.py 2>&1 | tail -5
}
WHL_IO=${WHL_IO:-.whl-io}
step kvikio 15 bash -c "$(declare -f kvikio_step); PYTHON=$PYTHON WHL_IO=$WHL_IO PYTHONPATH=$PYTHONPATH kvikio_step"

"$PYTHON" - "$RECS" "$OUT/io/io_s2_records.json" <<'EOF'
import json, pathlib, sys
recs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))]
pathlib.Path(sys.argv[2]).write_text(json.dumps(recs, indent=1))
print(f"\n{len(recs)} records -> {sys.argv[2]}")
print(f"{'record':<20} {'figure':<26} {'value':>12} {'unit':<10} {'ceiling':>12} {'ratio':>6}  peers (carina/peer)")
for r in recs:
    for f in r["figures"]:
        ratio = f["ratio_to_ceiling"]
        peers = ", ".join(f"{k} {v['ratio']:.2f}x" for k, v in f["peers"].items() if v["ratio"])
        ceil = f"{f['ceiling']:.4g}" if f["ceiling"] else "-"
        print(f"{r['name']:<20} {f['name']:<26} {f['value']:>12.4g} {f['unit']:<10} {ceil:>12} "
              f"{(f'{ratio:.0%}' if ratio else '-'):>6}  {peers}")
EOF
rm -rf "$RECS"
echo "io s2 done after $(($(date +%s) - start)) s (budget $BUDGET_S s)"
