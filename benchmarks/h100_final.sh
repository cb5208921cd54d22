#!/usr/bin/env bash
# Last device call of the session, in priority order: the offload peer harness for carina and FSDP2 (with
# the unlimited-memory ideal) on the 1.1B Llama at 8k tokens under an 8 GiB cap; carina.offload's GPU tests;
# carina.io's out-of-core GEMM and external sort. From the repository root: OUT=<dir> bash benchmarks/h100_final.sh
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 150 python3 benchmarks/offload/peers/harness.py --preset h100-1b --systems carina fsdp2_cpu_offload \
  --timeout 100 --out "$OUT" || echo "peers: exit $?"
cat "$OUT/offload_peers_summary.md" 2>/dev/null
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/offload 2>&1 | tail -5 | tee "$OUT/offload_gpu_tests.txt"
timeout 80 bash benchmarks/io/h100_followup.sh || echo "io follow-up: exit $?"
ls -la "$OUT"
