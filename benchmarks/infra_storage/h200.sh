#!/usr/bin/env bash
# carina.infra.storage on the GPU machine (NVIDIA H200, 16 cores): the tier end to end with a real NBD client
# (qemu-img), GPU engines against the CPU middle tier on the same host, in ONE run.
# HARD TIME BUDGET: BUDGET_S (default 150 s) of run time in all; give the call (or the lane) at least BUDGET_S + 15 s.
# Every step runs under `timeout` with min(its maximum, what is left) and is SKIPPED when less than its minimum is
# left, so no step starts that cannot finish. Each record is written into $OUT/storage/ the moment its block size
# ends (bench_tier_qemu.py rewrites its record after 4 KiB and again after 64 KiB).
# Steps (max / min seconds), files in $OUT/storage/ (3 at most):
#   smoke (10 / 3 s) and smoke_nvcomp (15 / 5 s): the torch (ZVC) and nvcomp (LZ4, zstd, deflate) engines round-trip
#       mixed blocks bit-exact with zlib CRCs through several launch threads; nvcomp's deflate blocks are also
#       decoded by zlib and zlib's by nvCOMP (LZ4/zstd too where their CPU packages load). PASS or FAIL, no file.
#   infra_storage_tier_h200_lz4.json      step tier_lz4 (55 / 25 s): qemu-img fill (convert, 16 in flight, then a
#       bit-exact compare), reads and constant-pattern writes (qemu-img bench, queue depth 32), 4 KiB and 64 KiB
#       blocks, systems: nvcomp (GPU, LZ4, 1 launch thread), torch (GPU, ZVC, 1 launch thread), inline (the
#       single-process CPU middle tier, LZ4), process (4 LZ4 worker processes), forward (codec raw: the ceiling).
#       nvcomp_vs_inline_* and torch_vs_inline_* are the GPU engines over the CPU tier; CPU-s/GB of every system.
#   infra_storage_tier_h200_deflate.json  step tier_deflate (55 / 25 s): the same with deflate (zlib's algorithm) as
#       the CPU tier's and nvcomp's codec (a slower CPU codec, where offloading weighs more).
#   storage_h200.log                      everything printed, and the summary table at the end.
# Carried: ONE git-ignored folder, .debs-storage (30 MB), built by bash benchmarks/infra_storage/fetch_h200_carry.sh:
#   qemu-utils and its libraries as Debian 12 .deb files (unpacked with dpkg-deb -x into /tmp, run through a wrapper
#   with LD_LIBRARY_PATH), the lz4 wheel for Python 3.12, and nvCOMP 6.0.0.12 for CUDA 13 / CPython 3.12 as a .tar.xz
#   of the PyPI wheels' runtime files (unpacked into /tmp, put on PYTHONPATH; nothing is installed). Without it: no
#   qemu-img (tier steps skipped), no LZ4, no nvcomp system (left out, its reason in the log). NVCOMP_WHL=<folder of
#   the two wheels> works too, where the call has room for them (34 MB).
# Usage (repository root): OUT=<dir> bash benchmarks/infra_storage/h200.sh
# CPU proof with tiny sizes: DEVICE=cpu PYTHON=/work/main/.venv/bin/python OUT=/tmp/storage_out bash benchmarks/...
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
DEBS=${DEBS:-.debs-storage}
NVCOMP_WHL=${NVCOMP_WHL:-.whl-nvcomp}
REC="$OUT/storage"
mkdir -p "$REC"
exec > >(tee "$REC/storage_h200.log") 2>&1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$REC"
[ -f .device-commit ] && export CARINA_SOURCE_COMMIT=$(cat .device-commit)  # the commit a copied tree holds
if [ "$DEVICE" = cpu ]; then  # tiny sizes: proves the script, not the machine (a loaded 2-core box is slow)
  BUDGET_S=${BUDGET_S:-600}; M=4
  TIER=(--data 4M --seconds 0.2 --workers 2 --gpu-workers 1)
else
  BUDGET_S=${BUDGET_S:-150}; M=1
  TIER=(--data 32M --seconds 0.5 --workers 4 --gpu-workers 1)
  nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true
fi
# shellcheck source=benchmarks/lane_steps.sh
source benchmarks/lane_steps.sh  # start, left, step

# carried tools: lz4 and nvCOMP wheels onto PYTHONPATH, qemu-img from the .deb files (sets NVCOMP, QEMU)
# shellcheck source=benchmarks/infra_storage/carried_tools.sh
source benchmarks/infra_storage/carried_tools.sh
echo "qemu-img: ${QEMU:-NOT AVAILABLE (tier steps skipped)}"

step smoke 3 10 "$PYTHON" benchmarks/infra_storage/smoke_torch_engine.py --device "$DEVICE"
if [ "$NVCOMP" = 1 ]; then
  step smoke_nvcomp 5 15 "$PYTHON" benchmarks/infra_storage/smoke_torch_engine.py --device "$DEVICE" --engine nvcomp \
    --codecs lz4,zstd,deflate
fi
SYSTEMS=nvcomp,torch,inline,process,forward
[ "$NVCOMP" = 1 ] || SYSTEMS=torch,inline,process,forward
if [ -n "$QEMU" ]; then
  if "$PYTHON" -c "import lz4.block" 2>/dev/null; then
    step tier_lz4 25 55 "$PYTHON" benchmarks/infra_storage/bench_tier_qemu.py --device "$DEVICE" --qemu-img "$QEMU" \
      --systems "$SYSTEMS" --main nvcomp,torch --base inline --blocks 4K,64K --codec lz4 "${TIER[@]}" \
      --name infra_storage_tier_h200_lz4
  else
    echo "== tier_lz4: SKIPPED (lz4 not importable)"
  fi
  step tier_deflate 25 55 "$PYTHON" benchmarks/infra_storage/bench_tier_qemu.py --device "$DEVICE" --qemu-img "$QEMU" \
    --systems "$SYSTEMS" --main nvcomp,torch --base inline --blocks 4K,64K --codec deflate "${TIER[@]}" \
    --name infra_storage_tier_h200_deflate
fi

"$PYTHON" - "$REC" <<'EOF'
import json, pathlib, sys
recs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))]
print(f"\n{len(recs)} records in {sys.argv[1]}")
print(f"{'record':<34} {'figure':<36} {'value':>9} {'unit':<5} {'ceiling':>9} {'ratio':>5}  peers")
for r in recs:
    for f in r["figures"]:
        if not f["name"].startswith(("nvcomp_vs", "torch_vs", "read_mb", "fill_mb", "write_const_mb", "verified")):
            continue
        ratio = f["ratio_to_ceiling"]
        peers = ", ".join(f"{k} {v['value']:.4g}" for k, v in list(f["peers"].items())[:5])
        ceil = f"{f['ceiling']:.4g}" if f["ceiling"] else "-"
        print(f"{r['name']:<34} {f['name']:<36} {f['value']:>9.4g} {f['unit']:<5} {ceil:>9} "
              f"{(f'{ratio:.0%}' if ratio else '-'):>5}  {peers}")
EOF
echo "storage h200 done after $(($(date +%s) - start)) s (budget $BUDGET_S s)"
