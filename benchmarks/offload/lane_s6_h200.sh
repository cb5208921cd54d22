#!/usr/bin/env bash
# Offload on the H200, next session (a device call of its own), as one lane of benchmarks/h100_combined.sh:
#  1. the GPU tests of tests/offload/test_cuda.py (the worker now takes ready tasks first; defaults are the device
#     fold/cast and updates past step());
#  2. the ideal (plain PyTorch, layer truncation) and the PCIe / CPU AdamW rates;
#  3. carina, 7B shape at 16 layers under a 24 GiB cap: 8k (one micro-batch of 4 sequences), 32k as ONE micro-batch
#     of 16 sequences (M32, what `carina offload plan --tokens-per-step 32768` recommends: predicted 1.70 s against
#     2.48 s for the 4 x 8k that ran in session 5), 128k as 8 x 16k (M128, the plan's split);
#  4. if the budget still holds its minimum (100 s), the 3B "no tax" row.
# HARD TIME BUDGET: 560 s in total (BUDGET), inside a lane limit of 575 s:
#   OUT=$OUT bash benchmarks/h100_combined.sh offload=benchmarks/offload/lane_s6_h200.sh:575
# Proof on a CPU (tiny sizes):  DEVICE=cpu OUT=/tmp/lane_out bash benchmarks/offload/lane_s6_h200.sh
# The plan only, on any machine (h100_s2.sh's preflight; a device run refuses a BUDGET that would skip or cut a phase):
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/h100_combined.sh offload=benchmarks/offload/lane_s6_h200.sh:575
# HEAD_CHUNK=N: the carina phases' loss in chunks of N tokens (carina.offload.chunked_lm_loss; records named
# offload_s2_7b16l_head<N>_<tokens>.json), e.g. the GPU tests, the ideal and 32k (about 180 s expected, 300 s hard):
#   HEAD_CHUNK=4096 PHASES="gpu_tests ideal carina_32k" BUDGET=300 OUT=$OUT bash benchmarks/h100_combined.sh \
#     offload=benchmarks/offload/lane_s6_h200.sh:315
set -uo pipefail
: "${OUT:?set OUT}"
export OUT LANE=${LANE:-offload}
export BUDGET=${BUDGET:-560}
export PHASES=${PHASES:-"gpu_tests ideal carina_8k carina_32k carina_128k notax_3b"}
exec bash benchmarks/offload/h100_s2.sh
