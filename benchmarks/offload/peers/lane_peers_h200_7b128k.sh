#!/usr/bin/env bash
# The peer comparison at the issue's 128k tokens per step, cut to 16 of the 7B shape's 32 layers (3.50B
# parameters): 24 GiB cap, each step as 8 micro-batches of 8 sequences (16k tokens; preset h200-7b16l-128k, the
# split `carina offload plan --model llama2-7b --layers 16 --tokens-per-step 131072 --device-budget 20.5GB`
# takes), the same split for every system, each accumulating gradients its documented way. A device call of
# its own. HARD BUDGET 575 s (lane limit 585 s). The ideal (plain, uncapped, 8 x 16k; the loss reference) first;
# where plain's activations do not fit uncapped, the 4/8-layer extrapolation and plain with activation
# checkpointing as the loss reference. Then carina, DeepSpeed ZeRO-3 offload, FSDP2 CPU offload, and torchao
# with offload_gradients (a row without a process: its docs rule out accumulation); 3 warm-up steps and 1 timed
# step of 8 micro-batches, 170 s per run. Expected: wheels and preflight ~15 s warm (56 s more cold),
# calibration 9, ideal ~80 (plain fits) or ~145 (it does not), carina ~75 (S2's 8.4 s steps), DeepSpeed ~110,
# FSDP2 ~110: ~400-470 s. Carry .whl and .whl-ds. Records: offload_peers_s7_7b16l_131072tok_8micro_24g_*.
#   OUT=$OUT bash benchmarks/h100_combined.sh peers128k=benchmarks/offload/peers/lane_peers_h200_7b128k.sh:585
# CPU proof (preset ci-accum: 2 micro-batches):
#   DEVICE=cpu PY=/work/main/.venv/bin/python SITE=/tmp/dssite OUT=/tmp/o bash <this script>
set -uo pipefail
if [ "${DEVICE:-gpu}" = cpu ]; then export PRESET=${PRESET:-ci-accum}  # the base lane's CPU budgets
else export PRESET=${PRESET:-h200-7b16l-128k} BUDGET=${BUDGET:-575} PER_RUN=${PER_RUN:-170}; fi
export LANE=${LANE:-peers128k}
export TAG=${TAG-s7}
exec bash "$(dirname "$0")/lane_peers_h200.sh"
