#!/usr/bin/env bash
# carina.infra.storage, issue 12 goal (b) on the GPU machine: the GPU engines against the CPU middle tier ON THE SAME
# CPU CORES, every server run as several front-end processes (--frontends) so the header path is not one core.
# HARD TIME BUDGET: BUDGET_S (default 290 s, at most 300) of run time in all; give the call (or the lane) at least
# BUDGET_S + 20 s. Every step runs under `timeout` with min(its maximum, what is left) and is SKIPPED when less than
# its minimum is left. Each record is written into $OUT/storage/ the moment its block size ends (bench_tier_qemu.py
# rewrites its record after 4 KiB and again after 64 KiB), so a step cut short still leaves its 4 KiB rows.
# Pinning: every server (front ends, codec workers, launch threads) runs under `taskset -c $SERVER_CPUS` (default the
# first FE cores: 0-3), the clients under `taskset -c $CLIENT_CPUS` (default 8-15), the same for every system.
# Clients: FE qemu-img processes per load sharing queue depth 32 (fill: each writes its own slice, 16 in flight).
# Systems (FE = 4 front ends by default):
#   inline        the one-process CPU middle tier (header and payload in one process): issue 12's baseline
#   inline-feFE   the CPU tier as FE processes on the same cores (the best CPU tier there: no handoffs)
#   process       one front end with FE codec worker processes on the same cores
#   torch-feFE    GPU engine (ZVC kernels), FE front ends with one launch thread each
#   nvcomp-feFE   GPU engine (nvCOMP batches of the step's codec), FE front ends, one launch thread each
#   forward-feFE  codec raw: no payload work at all, the ceiling of any engine behind FE front ends
#   torch-bsync-feFE, nvcomp-bsync-feFE  the GPU engines with --cuda-wait block (launch threads sleep in their
#                 waits instead of spinning on the front ends' cores); only with BSYNC=1 (session 8 measured them:
#                 no gain in MB/s, see docs/infra.storage.md), left out by default
# CODECS (default "lz4 deflate"): the codecs whose fe_<codec> steps run, in that order.
# GPU_WORKERS (default 1): launch threads per GPU front end, so batches in flight per front end. Session 12 found
#   nvCOMP bound by its call's round trip (the same requests/s with 1 front end as with 4); GPU_WORKERS=2 tells
#   whether two calls in flight per front end double that (a round trip) or not (the GPU serialises them).
# Every front end prepares its engine (CUDA graphs, CRC tables; nvCOMP: a codec round trip per launch thread, since
# session 12) before the server reports ready (since session 8; before, the front ends warmed up inside the timed
# fill); the rows' engine_prepare_s says how long that took.
# Steps (max / min seconds), files in $OUT/storage/:
#   smoke (10 / 3 s), smoke_nvcomp (12 / 5 s): the engines round-trip bit-exact (PASS/FAIL, no file)
#   infra_storage_tier_h200_fe_lz4.json      step fe_lz4 (130 / 40 s): fill + bit-exact compare, reads and
#       constant writes (qemu-img bench), 4 KiB and 64 KiB; *_vs_inline_* and *_vs_inline-feFE_* ratios
#   infra_storage_tier_h200_fe_deflate.json  step fe_deflate (130 / 40 s; gets what is left): the same with deflate
#   storage_h200_fe.log                      everything printed, and the summary table at the end
# Carried: the git-ignored folder .debs-storage (bash benchmarks/infra_storage/fetch_h200_carry.sh builds it): qemu-img
# and its libraries as .deb files, the lz4 wheel, nVIDIA nvCOMP as a .tar.xz (unpacked into /tmp; nothing installed).
# Usage (repository root): OUT=<dir> bash benchmarks/infra_storage/h200_frontends.sh
# CPU proof with tiny sizes (2 front ends on cores 0-1, clients on the same 2 cores):
#   DEVICE=cpu PYTHON=/work/main/.venv/bin/python OUT=/tmp/storage_out bash benchmarks/infra_storage/h200_frontends.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
DEBS=${DEBS:-.debs-storage}
REC="$OUT/storage"
mkdir -p "$REC"
exec > >(tee "$REC/storage_h200_fe.log") 2>&1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$REC"
[ -f .device-commit ] && export CARINA_SOURCE_COMMIT=$(cat .device-commit)  # the commit a copied tree holds
if [ "$DEVICE" = cpu ]; then  # tiny sizes: proves the script, not the machine
  BUDGET_S=${BUDGET_S:-280}; FE=${FE:-2}; SERVER_CPUS=${SERVER_CPUS:-0-1}; CLIENT_CPUS=${CLIENT_CPUS:-0-1}
  TIER=(--data 4M --seconds 0.2 --gpu-workers "${GPU_WORKERS:-1}")
else
  BUDGET_S=${BUDGET_S:-290}; FE=${FE:-4}; SERVER_CPUS=${SERVER_CPUS:-0-$((FE - 1))}; CLIENT_CPUS=${CLIENT_CPUS:-8-15}
  TIER=(--data 32M --seconds 0.5 --gpu-workers "${GPU_WORKERS:-1}")
  nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true
fi
[ "$BUDGET_S" -gt 300 ] && BUDGET_S=300
echo "budget $BUDGET_S s; $FE front ends; servers on CPUs $SERVER_CPUS, clients on $CLIENT_CPUS; $(nproc) CPUs"
# shellcheck source=benchmarks/lane_steps.sh
source benchmarks/lane_steps.sh  # start, left, step

# carried tools: lz4 and nvCOMP wheels onto PYTHONPATH, qemu-img from the .deb files (sets NVCOMP, QEMU)
# shellcheck source=benchmarks/infra_storage/carried_tools.sh
source benchmarks/infra_storage/carried_tools.sh
echo "qemu-img: ${QEMU:-NOT AVAILABLE (tier steps skipped)}; setup took $(($(date +%s) - start)) s"
command -v taskset >/dev/null || { echo "taskset missing: servers and clients NOT pinned"; SERVER_CPUS=; CLIENT_CPUS=; }

step smoke 3 10 "$PYTHON" benchmarks/infra_storage/smoke_torch_engine.py --device "$DEVICE"
[ "$NVCOMP" = 1 ] && step smoke_nvcomp 5 12 "$PYTHON" benchmarks/infra_storage/smoke_torch_engine.py \
  --device "$DEVICE" --engine nvcomp --codecs lz4,deflate
GPU="torch-fe$FE"; [ "$NVCOMP" = 1 ] && GPU="nvcomp-fe$FE,torch-fe$FE"
# BSYNC=1: the GPU engines once more with blocking-sync waits (-bsync: --cuda-wait block), same run
if [ "${BSYNC:-0}" = 1 ]; then GPU="$GPU,torch-bsync-fe$FE"; [ "$NVCOMP" = 1 ] && GPU="$GPU,nvcomp-bsync-fe$FE"; fi
SYSTEMS="$GPU,inline,inline-fe$FE,process,forward-fe$FE"
PIN=(--server-cpus "$SERVER_CPUS" --client-cpus "$CLIENT_CPUS" --clients "$FE" --workers "$FE")
for codec in ${CODECS:-lz4 deflate}; do
  if [ -z "$QEMU" ]; then echo "== fe_$codec: SKIPPED (no qemu-img)"; continue; fi
  if [ "$codec" = lz4 ] && ! "$PYTHON" -c "import lz4.block" 2>/dev/null; then
    echo "== fe_lz4: SKIPPED (lz4 not importable)"; continue
  fi
  step "fe_$codec" 40 130 "$PYTHON" benchmarks/infra_storage/bench_tier_qemu.py --device "$DEVICE" --qemu-img "$QEMU" \
    --systems "$SYSTEMS" --main "$GPU" --base "inline,inline-fe$FE" --blocks 4K,64K --codec "$codec" "${PIN[@]}" \
    "${TIER[@]}" --name "infra_storage_tier_h200_fe_$codec"
done

"$PYTHON" - "$REC" <<'EOF'
import json, pathlib, sys
recs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("infra_storage_tier_h200_fe_*.json"))]
print(f"\n{len(recs)} records in {sys.argv[1]}")
for r in recs:
    for f in r["figures"]:
        if "_vs_" in f["name"] or f["name"].startswith("verified"):
            ceil = f"{f['ceiling']:.3g}" if f.get("ceiling") else "-"
            print(f"{r['name']:<36} {f['name']:<44} {f['value']:>8.3g} {f['unit']:<4} ceiling {ceil}")
    for row in r["metrics"]["rows"]:  # the GPU engines' host time per batch by step (wall / launch-thread CPU, us)
        steps = sorted(k[5:-8] for k in row if k.startswith("step_") and k.endswith("_wall_us"))
        if steps:
            cells = " ".join(f"{s} {row[f'step_{s}_wall_us']:.0f}/{row[f'step_{s}_cpu_us']:.0f}" for s in steps)
            print(f"{r['name']:<36} {row['system']:<16} {row['block']:>6} us/batch {cells}")
EOF
echo "storage h200 front ends done after $(($(date +%s) - start)) s (budget $BUDGET_S s)"
