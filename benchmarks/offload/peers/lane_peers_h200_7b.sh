#!/usr/bin/env bash
# The peer comparison at the 7B shape cut to 16 layers (3.50B parameters) / 24 GiB cap / 8k tokens (preset
# h200-7b16l), as a lane of its own: lane_peers_h200.sh with that preset. HARD BUDGET 560 s (give the lane
# >= 570 s, so it does not fit one 600 s device call beside the 1.1B lane; in the same call after it, the
# DeepSpeed builds are cached in TORCH_EXTENSIONS_DIR and the preflight takes seconds). 150 s per system
# run (expected: carina ~110, FSDP2 ~90, DeepSpeed ~150, torchao out of memory ~40, ideal ~60).
# Usage (repository root): OUT=<dir> bash benchmarks/offload/peers/lane_peers_h200_7b.sh
set -uo pipefail
export PRESET=${PRESET:-h200-7b16l} LANE=${LANE:-peers7b} BUDGET=${BUDGET:-560} PER_RUN=${PER_RUN:-150}
exec bash "$(dirname "$0")/lane_peers_h200.sh"
