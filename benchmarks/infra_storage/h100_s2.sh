#!/usr/bin/env bash
# carina.infra.storage on the H100 machine: the GPU codec (torch ZVC) vs PCIe and vs the CPU codec pools on 16 cores.
# Hard budget: 95 s of run time (steps under `timeout`: 5 + 24 + 60 s, 1 s kill grace each; about 45 s expected).
# Each step writes its record into $OUT/storage/ as soon as it finishes; the key figures are printed to the log too.
# Two records into $OUT/storage/:
#   infra_storage_gpu_codec_h100.json  ZVC kernels on device-resident 64 MiB batches, pinned H2D/D2H copies of the
#                                      same batches, and the tier's torch engine end to end (4 KiB and 64 KiB blocks);
#   infra_storage_engines_h100.json    LZ4 and zlib payload engines alone: inline (1 core), thread pool 1..16, process
#                                      pool 16, and the torch ZVC engine on the GPU, 64 KiB blocks, 256 KiB requests, QD 32.
# zlib is in the standard library: the second device call had no lz4 module, bench_engines.py skipped LZ4 and with it
# every CPU engine, so the pool comparison was lost; with zlib it always runs (LZ4 too where the package is present).
# nvCOMP (GPU LZ4/zstd/deflate) is not installed on the machine, so ZVC is the only GPU codec; the records say so.
# Usage (repository root): OUT=<dir> bash benchmarks/infra_storage/h100_s2.sh
# Proof run on a CPU machine with tiny sizes: DEVICE=cpu OUT=/tmp/storage_out bash benchmarks/infra_storage/h100_s2.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the records go to}"
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "$PYTHON" = python3 ] && PYTHON=.venv/bin/python
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/storage"
mkdir -p "$OUT/storage"
if [ "$DEVICE" = cpu ]; then   # tiny sizes: proves the script, not the machine
  GPU_ARGS=(--data 8M --batch 2M --request 256K --seconds 0.2 --reps 2)
  ENG_ARGS=(--workers 1,2 --process-workers 2 --data 4M --seconds 0.2 --rounds 1)
  SUFFIX=_cpu_smoke
  SCALE=${SCALE:-6}            # a shared 2-core CPU machine is far slower than the H100 host: stretch the limits
else
  GPU_ARGS=(--data 128M --batch 64M --request 1M --seconds 0.5 --reps 5)
  ENG_ARGS=(--workers 1,2,4,8,16 --process-workers 16 --data 32M --seconds 0.5 --rounds 1)
  SUFFIX=_h100
  SCALE=${SCALE:-1}
fi
start=$(date +%s)
status=0
step() {  # step <seconds> <label> <command...>: run under timeout, keep going on failure
  local limit=$(($1 * SCALE)) label=$2; shift 2
  echo "== $label (limit ${limit}s)"
  timeout --kill-after=1 "$limit" "$@" || { echo "!! $label failed or timed out (rc $?)"; status=1; }
  echo "   $label done at $(($(date +%s) - start)) s"
}
[ "$DEVICE" = cuda ] && step 5 nvidia-smi nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
step 24 "GPU codec (ZVC) vs PCIe, $DEVICE" "$PYTHON" benchmarks/infra_storage/bench_gpu_codec.py --device "$DEVICE" \
  --blocks 4K,64K "${GPU_ARGS[@]}" --name "infra_storage_gpu_codec$SUFFIX"
step 60 "CPU pools (1..16) vs GPU engine" "$PYTHON" benchmarks/infra_storage/bench_engines.py --codecs lz4,zlib,zvc \
  --blocks 64K --pools thread,process --request 256K --streams 32 --torch-device "$DEVICE" "${ENG_ARGS[@]}" \
  --name "infra_storage_engines$SUFFIX"
echo "== summary (total $(($(date +%s) - start)) s, status $status)"
"$PYTHON" - "$OUT/storage" <<'PY' || status=1
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    rec = json.loads(path.read_text())
    print(f"-- {rec['name']} ({rec['machine']['label']})")
    for f in rec["figures"]:
        peers = ", ".join(f"{k} {v['value']:.4g}" for k, v in (f.get("peers") or {}).items())
        ceil = f" ceiling {f['ceiling']:.4g}" if f.get("ceiling") else ""
        print(f"{f['name']:36s} {f['value']:10.4g} {f['unit']:5s}{ceil}  {peers}")
PY
exit "$status"
