#!/usr/bin/env bash
# Diagnostic lane (session 3): why carina's 1.1B / 8 GiB row ran at 2.0 s per step against its plan's 0.54 s.
# carina alone in the peers harness (no ideal), at the harness's plan fraction (90% of the cap) and at 75%,
# each record with the CUDA allocator's counters (num_alloc_retries: the allocator emptied its cache and
# retried near the cap, which synchronizes the device). HARD BUDGET: 2 x 85 s (calibration ~10 s + carina ~55 s
# each; session 3's first try gave each harness 68 s, less than its own 62 s per-run limit plus calibration,
# and lost both runs): give the lane >= 175 s.
# Usage (repository root): OUT=<dir> bash benchmarks/offload/peers/lane_diag.sh
set -uo pipefail
: "${OUT:?set OUT}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for f in 0.9 0.75; do
  mkdir -p "$OUT/diag/f$f"
  PEERS_CARINA_PLAN_FRACTION=$f timeout 85 python3 benchmarks/offload/peers/harness.py --preset h100-1b \
    --systems carina --skip-ideal --timeout 72 --out "$OUT/diag/f$f" 2>&1 | grep '^\[harness\]'
  python3 - "$OUT/diag/f$f/offload_peers_1b_8192tok_8g_carina.json" "$f" <<'PY' || true
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
plan = (m.get("settings") or {}).get("plan") or {}
print(f"fraction {sys.argv[2]}: {m['status']} steps {m['step_s']} predicted {plan.get('predicted_s', {}).get('step')} "
      f"allocator {m.get('allocator')} peak_gpu {m.get('peak_gpu_bytes')}")
PY
done
