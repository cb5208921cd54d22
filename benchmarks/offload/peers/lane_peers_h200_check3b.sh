#!/usr/bin/env bash
# The issue's correctness check: every system a few steps on the 3B model (llama-3b shape, 3.43B parameters),
# each step's loss against plain PyTorch's on the same CPU-seeded weights and tokens (preset h200-3b-check:
# 4096 tokens per step, 3 warm-up and 2 timed steps, so 5 losses after 0-4 updates). Plain runs uncapped first
# (it fits the H200: 16 B a parameter, 51 GiB) and is the reference; carina, FSDP2 and DeepSpeed ZeRO-Offload
# train under a 12 GiB cap (carina streams its weights there), torchao's CPUOffloadOptimizer uncapped (its fp32
# weights and gradients, 26 GiB, stay on the GPU). No calibration (no roofline: a check, not a speed figure).
# Each record's metrics.loss_check has within (every step within 2^-8 of plain's, relative), max_abs_diff,
# drift and the reference's losses. HARD BUDGET 240 s (lane limit 250 s). Expected: wheels and preflight ~15 s
# with DeepSpeed's op built by an earlier lane on this machine (56 s more cold: run it after another peers
# lane), plain ~55 (builds and saves the 3B weights), carina ~40, FSDP2 ~45, DeepSpeed ~55, torchao ~40:
# ~250 s; a system left without time is a 'not run' row saying so (torchao last).
# Carry .whl and .whl-ds. Records: offload_peers_s7_3b_4096tok_12g_*.
#   OUT=$OUT bash benchmarks/h100_combined.sh check3b=benchmarks/offload/peers/lane_peers_h200_check3b.sh:250
# CPU proof (preset ci-check, the tiny model):
#   DEVICE=cpu PY=/work/main/.venv/bin/python SITE=/tmp/dssite OUT=/tmp/o bash <this script>
set -uo pipefail
if [ "${DEVICE:-gpu}" = cpu ]; then export PRESET=${PRESET:-ci-check}  # the base lane's CPU budgets
else export PRESET=${PRESET:-h200-3b-check} BUDGET=${BUDGET:-240} PER_RUN=${PER_RUN:-90}; fi
export LANE=${LANE:-check3b}
export TAG=${TAG-s7}
exec bash "$(dirname "$0")/lane_peers_h200.sh"
