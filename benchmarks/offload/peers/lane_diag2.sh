#!/usr/bin/env bash
# Second diagnostic lane (session 3): at 1.1B / 8 GiB the CPU optimizer updated 1.24B parameters in
# 1.65 s of a 1.97 s step (0.75 Gparam/s), while in the S2 run (7B shape, 16 layers) it ran at 4.1 Gparam/s.
# Two carina runs in the peers harness, each changing one thing: the optimizer at optimizer.step() instead of
# during backward (overlap "step"), and an 8-thread optimizer team (cpu_optimizer_threads 8).
# HARD BUDGET: 2 x 85 s; give the lane >= 175 s.
# Usage (repository root): OUT=<dir> bash benchmarks/offload/peers/lane_diag2.sh
set -uo pipefail
: "${OUT:?set OUT}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for case in overlap_step:'{"overlap":"step"}' threads8:'{"cpu_optimizer_threads":8}'; do
  name=${case%%:*}; conf=${case#*:}
  mkdir -p "$OUT/diag2/$name"
  PEERS_CARINA_CONFIG=$conf timeout 85 python3 benchmarks/offload/peers/harness.py --preset h100-1b \
    --systems carina --skip-ideal --timeout 72 --out "$OUT/diag2/$name" 2>&1 | grep '^\[harness\]'
  python3 - "$OUT/diag2/$name/offload_peers_1b_8192tok_8g_carina.json" "$name" <<'PY' || true
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
split = (m.get("settings") or {}).get("step_split") or {}
print(sys.argv[2], m["status"], m["step_s"], {k: round(v, 3) for k, v in split.items() if k.startswith(("optim", "step", "wall"))})
PY
done
