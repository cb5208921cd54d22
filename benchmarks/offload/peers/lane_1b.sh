#!/usr/bin/env bash
# The 1.1B peer row on the GPU machine, as one lane of benchmarks/h100_combined.sh: carina, FSDP2
# CPUOffloadPolicy and torchao's CPUOffloadOptimizer (torchao from a carried wheel in .whl/) on the 1.1B
# Llama at 8k tokens under an 8 GiB cap, with the unlimited-memory ideal measured after them.
# HARD BUDGET: the lane's limit (170 s in the session-3 call); the harness writes each system's record into
# $OUT/peers/ as soon as that system ends, so a kill loses only the systems not yet run.
# Usage (repository root): OUT=<dir> bash benchmarks/offload/peers/lane_1b.sh
set -uo pipefail
: "${OUT:?set OUT}"
mkdir -p "$OUT/peers"
export PYTHONPATH="/tmp/peers-site:$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if ls .whl/torchao-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers-site .whl/torchao-*.whl 2>&1 | tail -2
fi
SYSTEMS=${SYSTEMS:-carina fsdp2_cpu_offload torchao_cpu_offload}
# shellcheck disable=SC2086
python3 benchmarks/offload/peers/harness.py --preset h100-1b --systems $SYSTEMS --timeout 75 --out "$OUT/peers"
cat "$OUT/peers/offload_peers_summary.md" 2>/dev/null
