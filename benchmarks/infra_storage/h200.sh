#!/usr/bin/env bash
# carina.infra.storage on the GPU machine (NVIDIA H200, 16 cores): the GPU engine against the CPU middle tier, in ONE
# run on the same host cores. HARD TIME BUDGET: BUDGET_S (default 120 s) of run time in all; give the call a limit of
# at least BUDGET_S + 15 s. Every step runs under `timeout` with min(its maximum, what is left) and is SKIPPED when
# less than its minimum is left, so no step starts that cannot finish. Each step writes its record into $OUT/storage/
# the moment it ends (the tier step after each block size). Steps (max / min seconds), files in $OUT/storage/ (4 at most):
#   (step 0, smoke (10 / 3 s): the torch engine's GPU path round-trips mixed blocks bit-exact with zlib CRCs through
#       several launch threads; prints PASS or the first mismatch and whether the arena is registered; no file)
#   infra_storage_engines_h200.json    step 1 (60 / 35 s): payload engines alone, in one process on the
#       same cores: inline (the single-process CPU middle tier), thread pools 1,2,4,8,16, process pools 1,4,16 (zlib;
#       LZ4 too when the carried wheel loads), the torch engine on the GPU (ZVC, 1 and 4 launch threads) and ZVC
#       inline on the CPU; 4 KiB and 64 KiB blocks, 256 KiB requests, 32 in flight. gpu_vs_cpu_tier_<codec>_<B>_<op>
#       = GPU engine MB/s over the best CPU tier using no more cores than the GPU engine's host side did, with the
#       pinned PCIe copy rate of the same run as the ceiling (this is the issue's ">= 3x on the same cores" figure).
#   infra_storage_gpu_codec_h200.json  step 2 (15 / 8 s): the engine's device work (ZVC pack/unpack + CRC-32 of every
#       block on the GPU) on device-resident 64 MiB batches vs pinned H2D/D2H copies, 4 KiB and 64 KiB blocks.
#   infra_storage_tier_h200.json       step 3 (35 / 20 s): the tier end to end with a real NBD client, qemu-img (its own
#       client, no libnbd: fio's NBD engine needs libnbd -> libxml2 -> ICU plus Ceph/gluster libraries, ~84 MB, too
#       big to carry): torch (GPU), inline, thread x8 (zlib), forward (codec raw: the ceiling); fill with qemu-img
#       convert (16 in flight), reads and constant-pattern writes with qemu-img bench at queue depth 32.
#   storage_h200.log                   everything printed, and the summary table at the end.
# Carried (optional, DEBS=.debs-storage, 8 MB, git-ignored): qemu-utils and its libraries as Debian 12 .deb files
# (unpacked with dpkg-deb -x into /tmp, run through a wrapper with LD_LIBRARY_PATH) and the lz4 wheel for Python 3.12
# (unzipped into /tmp, on PYTHONPATH). Without it: step 3 is skipped unless qemu-img is installed, and LZ4 is skipped.
# Build the folder in the checkout that the device call sends: bash benchmarks/infra_storage/fetch_h200_carry.sh
# nvCOMP is not installed there, so ZVC is the only GPU codec; the records say so.
# Usage (repository root): OUT=<dir> bash benchmarks/infra_storage/h200.sh
# CPU proof with tiny sizes: DEVICE=cpu PYTHON=/work/main/.venv/bin/python OUT=/tmp/storage_out bash benchmarks/...
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
DEBS=${DEBS:-.debs-storage}
REC="$OUT/storage"
mkdir -p "$REC"
exec > >(tee "$REC/storage_h200.log") 2>&1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$REC"
[ -f .device-commit ] && export CARINA_SOURCE_COMMIT=$(cat .device-commit)  # the commit a copied tree holds
if [ "$DEVICE" = cpu ]; then  # tiny sizes: proves the script, not the machine (a loaded 2-core box is slow)
  BUDGET_S=${BUDGET_S:-900}; M=6
  ENG=(--workers 1,2 --process-workers 2 --torch-workers 1,2 --data 2M --seconds 0.2)
  GPU=(--data 4M --batch 2M --reps 1)
  TIER=(--data 4M --seconds 0.2 --workers 2)
else
  BUDGET_S=${BUDGET_S:-120}; M=1
  ENG=(--workers 1,2,4,8,16 --process-workers 1,4,16 --torch-workers 1,4 --data 8M --seconds 0.3)
  GPU=(--data 64M --batch 64M --reps 5)
  TIER=(--data 32M --seconds 0.5 --workers 8)
  nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true
fi
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
step() {  # step NAME MIN_S MAX_S CMD...: timeout min(MAX_S, budget left); skipped when fewer than MIN_S are left
  local name=$1 min=$(($2 * M)) max=$(($3 * M)); shift 3
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then echo "== $name: SKIPPED ($l s left, needs $min s)"; return; fi
  [ "$max" -gt "$l" ] && max=$l
  echo "== $name (timeout $max s, t=$(($(date +%s) - start)) s)"
  timeout -k 3 "$max" "$@"; local rc=$?
  echo "== $name rc=$rc after $(($(date +%s) - start)) s; files in $REC: $(find "$REC" -maxdepth 1 -type f | wc -l)"
}

# carried tools: the lz4 wheel onto PYTHONPATH, qemu-img from the .deb files behind a wrapper
if ! "$PYTHON" -c "import lz4.block" 2>/dev/null && ls "$DEBS"/lz4-*.whl >/dev/null 2>&1; then
  W=$(mktemp -d /tmp/carina-whl-XXXX)
  for w in "$DEBS"/*.whl; do "$PYTHON" -m zipfile -e "$w" "$W"; done
  export PYTHONPATH="$PYTHONPATH:$W"
fi
"$PYTHON" -c "import lz4.block; print('lz4', lz4.__version__)" 2>/dev/null || echo "lz4: not importable (CPU tier runs zlib only)"
QEMU=${QEMU_IMG:-}
if [ -z "$QEMU" ] && ls "$DEBS"/qemu-utils_*.deb >/dev/null 2>&1; then
  P=$(mktemp -d /tmp/carina-qemu-XXXX)
  for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$P"; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/usr/lib/x86_64-linux-gnu:%s/lib/x86_64-linux-gnu exec %s/usr/bin/qemu-img "$@"\n' \
    "$P" "$P" "$P" > "$P/qemu-img.sh"
  chmod +x "$P/qemu-img.sh"
  "$P/qemu-img.sh" --version | head -1 && QEMU="$P/qemu-img.sh"
fi
[ -z "$QEMU" ] && QEMU=$(command -v qemu-img || true)
echo "qemu-img: ${QEMU:-NOT AVAILABLE (step 3 skipped)}"
CODECS=zlib,zvc
"$PYTHON" -c "import lz4.block" 2>/dev/null && CODECS=zlib,lz4,zvc

step smoke 3 10 "$PYTHON" benchmarks/infra_storage/smoke_torch_engine.py --device "$DEVICE"
step engines 35 60 "$PYTHON" benchmarks/infra_storage/bench_engines.py --codecs "$CODECS" --blocks 64K,4K \
  --pools thread,process --request 256K --streams 32 --torch-device "$DEVICE" --rounds 1 "${ENG[@]}" \
  --name infra_storage_engines_h200
step gpu_codec 8 15 "$PYTHON" benchmarks/infra_storage/bench_gpu_codec.py --device "$DEVICE" --blocks 4K,64K \
  --engine-data 0 "${GPU[@]}" --name infra_storage_gpu_codec_h200
if [ -n "$QEMU" ]; then
  step tier 20 35 "$PYTHON" benchmarks/infra_storage/bench_tier_qemu.py --device "$DEVICE" --qemu-img "$QEMU" \
    --systems torch,inline,thread,forward --blocks 4K,64K --codec zlib "${TIER[@]}" --name infra_storage_tier_h200
fi

"$PYTHON" - "$REC" <<'EOF'
import json, pathlib, sys
recs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))]
print(f"\n{len(recs)} records in {sys.argv[1]}")
print(f"{'record':<28} {'figure':<40} {'value':>10} {'unit':<6} {'ceiling':>10} {'ratio':>6}  peers")
for r in recs:
    for f in r["figures"]:
        if not f["name"].startswith(("gpu_vs", "torch_vs", "zvc_kernel", "read_mb", "fill_mb", "available")) and \
                "torch-" not in f["name"]:
            continue
        ratio = f["ratio_to_ceiling"]
        peers = ", ".join(f"{k} {v['value']:.4g}" for k, v in list(f["peers"].items())[:4])
        ceil = f"{f['ceiling']:.4g}" if f["ceiling"] else "-"
        print(f"{r['name']:<28} {f['name']:<40} {f['value']:>10.4g} {f['unit']:<6} {ceil:>10} "
              f"{(f'{ratio:.0%}' if ratio else '-'):>6}  {peers}")
EOF
echo "storage h200 done after $(($(date +%s) - start)) s (budget $BUDGET_S s)"
