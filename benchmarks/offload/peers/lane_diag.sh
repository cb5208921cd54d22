#!/usr/bin/env bash
# Diagnostic lane (session 3): carina alone in the peers harness at 1.1B / 8 GiB (no ideal), once per case,
# each record with carina's step split and the CUDA allocator's counters. A case is NAME=ENV=VALUE (one
# environment variable of the harness: PEERS_CARINA_PLAN_FRACTION, the share of the cap carina plans in, or
# PEERS_CARINA_CONFIG, JSON merged into carina's OffloadConfig).
#   default CASES: f0.9 and f0.75 of the cap (session 3's fourth call);
#   CASES='overlap_step=PEERS_CARINA_CONFIG={"overlap":"step"} threads8=PEERS_CARINA_CONFIG={"cpu_optimizer_threads":8}'
#   (the fifth call).
# HARD BUDGET: 85 s a case (calibration ~10 s + carina ~55 s; the first try gave each harness 68 s, less than
# its own per-run limit plus calibration, and lost both runs): give the lane >= 85 s x cases + 5 s.
# Usage (repository root): OUT=<dir> [CASES=...] bash benchmarks/offload/peers/lane_diag.sh
set -uo pipefail
: "${OUT:?set OUT}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
CASES=${CASES:-"f0.9=PEERS_CARINA_PLAN_FRACTION=0.9 f0.75=PEERS_CARINA_PLAN_FRACTION=0.75"}
for case in $CASES; do
  name=${case%%=*}; assign=${case#*=}
  mkdir -p "$OUT/diag/$name"
  env "$assign" timeout 85 python3 benchmarks/offload/peers/harness.py --preset h100-1b \
    --systems carina --skip-ideal --timeout 72 --out "$OUT/diag/$name" 2>&1 | grep '^\[harness\]'
  python3 - "$OUT/diag/$name/offload_peers_1b_8192tok_8g_carina.json" "$name" <<'PY' || true
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
split = (m.get("settings") or {}).get("step_split") or {}
plan = (m.get("settings") or {}).get("plan") or {}
print(sys.argv[2], m["status"], m["step_s"], "predicted", plan.get("predicted_s", {}).get("step"),
      "allocator", m.get("allocator"), {k: round(v, 3) for k, v in split.items() if k.startswith(("optim", "step"))})
PY
done
