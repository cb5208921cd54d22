#!/usr/bin/env bash
# The peer comparison at the issue's headline configuration, cut to 16 of the 7B shape's 32 layers (3.50B
# parameters): 24 GiB cap, 32k tokens per step as one micro-batch of 16 sequences (preset h200-7b16l-32k), a
# device call of its own. HARD BUDGET 575 s (lane limit 585 s). The ideal (plain, uncapped; the loss reference)
# first, then carina, DeepSpeed ZeRO-3 offload, FSDP2 CPU offload, torchao with offload_gradients; 150 s per run.
# Carry .whl and .whl-ds (benchmarks/offload/peers/fetch_h200_carry.sh). Records: offload_peers_s6_7b16l_32768tok_*.
#   OUT=$OUT bash benchmarks/h100_combined.sh peers32k=benchmarks/offload/peers/lane_peers_h200_7b32k.sh:585
set -uo pipefail
export PRESET=${PRESET:-h200-7b16l-32k} LANE=${LANE:-peers32k} BUDGET=${BUDGET:-575} PER_RUN=${PER_RUN:-150}
export TAG=${TAG-s6}
exec bash "$(dirname "$0")/lane_peers_h200.sh"
