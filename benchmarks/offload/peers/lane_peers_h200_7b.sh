#!/usr/bin/env bash
# The peer comparison at the 7B shape cut to 16 layers (3.50B parameters) / 24 GiB cap / 8k tokens (preset
# h200-7b16l), as a lane of its own: lane_peers_h200.sh with that preset. HARD BUDGET 575 s (give the lane
# 585 s: a device call of its own, it does not fit one 600 s call beside the 1.1B lane). The ideal (plain
# uncapped, the loss reference) runs first, then carina, DeepSpeed, FSDP2, torchao with offload_gradients,
# torchao as is; 150 s per run (expected: preflight 70 cold, ideal 60, carina 110, DeepSpeed 150, FSDP2 90,
# torchao-grads 70, torchao out of memory 40): the last ones may be cut, and a cut run is a row with its reason.
# Usage (repository root): OUT=<dir> bash benchmarks/offload/peers/lane_peers_h200_7b.sh
set -uo pipefail
export PRESET=${PRESET:-h200-7b16l} LANE=${LANE:-peers7b} BUDGET=${BUDGET:-575} PER_RUN=${PER_RUN:-150}
export TAG=${TAG-s6}  # the 8k run of session 5 is offload_peers_s4_7b16l_* (carina with the old defaults)
exec bash "$(dirname "$0")/lane_peers_h200.sh"
