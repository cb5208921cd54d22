#!/usr/bin/env bash
# Last device call of the session: carina.io's out-of-core GEMM and external sort, then the offload
# peer harness for carina and FSDP2 (with the unlimited-memory ideal) on the 1.1B Llama at 8k tokens
# under an 8 GiB cap. Run from the repository root on the GPU machine: OUT=<dir> bash benchmarks/h100_final.sh
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 110 bash benchmarks/io/h100_followup.sh || echo "io follow-up: exit $?"
timeout 130 python3 benchmarks/offload/peers/harness.py --preset h100-1b --systems carina fsdp2_cpu_offload \
  --timeout 100 --out "$OUT" || echo "peers: exit $?"
ls -la "$OUT"
