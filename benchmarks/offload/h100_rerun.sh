#!/usr/bin/env bash
# Session-2 first device call: re-run carina (with the head-workspace planning fix) beside FSDP2 CPU offload
# and the plain-PyTorch ideal on the 1.1B Llama at 8k tokens under the 8 GiB cap, then carina.offload's GPU
# tests. Run time about 180 s. From the repository root: OUT=<dir> bash benchmarks/offload/h100_rerun.sh
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/peers"
pack() { tar -C "$OUT" -czf "$OUT/results.tgz" peers 2>/dev/null; }
trap pack EXIT
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 150 python3 benchmarks/offload/peers/harness.py --preset h100-1b --systems carina fsdp2_cpu_offload \
  --timeout 120 --out "$OUT/peers" 2>&1 | tee "$OUT/peers/harness.log" | tail -25 || echo "peers: exit $?"
pack
cat "$OUT/peers/offload_peers_summary.md" 2>/dev/null
timeout 30 python3 -m pytest -q -p no:cacheprovider -m gpu tests/offload 2>&1 | tail -30 > "$OUT/peers/offload_gpu_tests.txt"; tail -3 "$OUT/peers/offload_gpu_tests.txt"
