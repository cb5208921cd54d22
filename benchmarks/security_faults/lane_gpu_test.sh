#!/usr/bin/env bash
# One lane of a device call: security.faults' gpu-marked test (the batched engine on CUDA equals the CPU
# engine bit for bit), on the SkyNet data carried in shared/data/skynet. HARD BUDGET 45 s.
# Usage (repository root): OUT=<dir> bash benchmarks/security_faults/lane_gpu_test.sh
set -uo pipefail
: "${OUT:?set OUT}"
mkdir -p "$OUT/faults"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
[ -z "${CARINA_SHARED_DIR:-}" ] && [ -d shared/data/skynet ] && export CARINA_SHARED_DIR="$PWD/shared"
timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/security/faults 2>&1 | tee "$OUT/faults/gpu_tests.txt" | tail -5
