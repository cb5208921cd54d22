#!/usr/bin/env bash
# The peer comparison at the 7B shape cut to 16 layers (3.50B parameters) / 24 GiB cap / 8k tokens (preset
# h200-7b16l), as a lane of its own: lane_peers_h200.sh with that preset. HARD BUDGET 330 s (lane limit 340 s).
# The ideal (plain uncapped, the loss reference, on the same CPU-seeded weights) runs first, then carina,
# DeepSpeed, FSDP2; 3 warm-up and 2 timed steps, 120 s per run. Both torchao rows are not run again: they ran
# out of memory at this configuration in session 5 (h200/offload_peers_s4_7b16l_8192tok_24g_torchao_*.json,
# named in their rows). Expected, from session 6's 32k lane (456 s: preflight 56 cold, calibration 9, carina 87,
# DeepSpeed 105, FSDP2 98, of which ~30 s each was the model's CPU init that the weights cache now does once):
# wheels 7, preflight 56 cold (~12 with the op built by an earlier lane on this machine), calibration 9, ideal
# ~60 (builds and saves the weights), carina ~50, DeepSpeed ~70, FSDP2 ~60: ~310 s cold, ~270 s warm.
# Carry .whl and .whl-ds. Records: offload_peers_s7_7b16l_8192tok_24g_*.
#   OUT=$OUT bash benchmarks/h100_combined.sh peers8k=benchmarks/offload/peers/lane_peers_h200_7b.sh:340
# CPU proof (preset ci, the tiny model):
#   DEVICE=cpu PY=/work/main/.venv/bin/python SITE=/tmp/dssite OUT=/tmp/o bash <this script>
set -uo pipefail
if [ "${DEVICE:-gpu}" = cpu ]; then export PRESET=${PRESET:-ci}  # the base lane's CPU budgets
else export PRESET=${PRESET:-h200-7b16l} BUDGET=${BUDGET:-330} PER_RUN=${PER_RUN:-120}; fi
export LANE=${LANE:-peers8k}
export TAG=${TAG-s7}  # session 5's 8k run is offload_peers_s4_7b16l_* (carina with the old defaults)
exec bash "$(dirname "$0")/lane_peers_h200.sh"
