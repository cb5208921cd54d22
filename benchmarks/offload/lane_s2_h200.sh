#!/usr/bin/env bash
# S2 on the H200 after the fold/cast change, as one lane of benchmarks/h100_combined.sh:
#  1. the GPU tests of tests/offload/test_cuda.py (fold and cast on the device against the host path, bitwise;
#     at most 60 s; summary in gpu_tests.txt);
#  2. the ideal (plain PyTorch, layer truncation) and the PCIe / CPU AdamW rates;
#  3. carina on the 7B shape at 16 of its 32 layers (3.50B parameters) under a 24 GiB GPU cap at 8k and then 32k
#     tokens/step (records offload_s2_7b16l_{8k,32k}.json, ideal and roofline in the same record);
#  4. the NVMe spill row: the 7B shape at 4 layers, 8k tokens, a host budget two blocks' optimizer state short,
#     the tier's write/read rates measured first (offload_s2_7b4l_spill_8k.json, disk roofline as a peer);
#  5. if the budget still holds its minimum (100 s), the 3B "no tax" row (no budget, carina vs plain PyTorch).
# Every carina record holds metrics.step_split_s (the step timer: compute-stream phases and the CPU worker's
# update / fold / cast / disk) beside metrics.carina.plan.predicted_s (the plan's compute, PCIe, cpu_update,
# cpu_fold, cpu_cast, disk, step). The phases and their limits are benchmarks/offload/h100_s2.sh's (each under
# `timeout`; each phase's JSON and the records rewritten in $OUT/$LANE as soon as the phase ends).
#
# HARD TIME BUDGET: 430 s in total (BUDGET; 420 s until h100_s2.sh's preflight found the 3B row 3 s short of its
# minimum there), inside a lane limit of 440 s:
#   OUT=$OUT bash benchmarks/h100_combined.sh offload=benchmarks/offload/lane_s2_h200.sh:440
# Proof on a CPU (tiny sizes, every phase and the report):
#   DEVICE=cpu OUT=/tmp/lane_out bash benchmarks/offload/lane_s2_h200.sh
# The plan only, on any machine (h100_s2.sh's preflight; a device run refuses a BUDGET that would skip or cut a phase):
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/h100_combined.sh offload=benchmarks/offload/lane_s2_h200.sh:440
set -uo pipefail
: "${OUT:?set OUT}"
export OUT LANE=${LANE:-offload}
export BUDGET=${BUDGET:-430}
export PHASES=${PHASES:-"gpu_tests ideal carina_8k carina_32k spill_8k notax_3b"}
exec bash benchmarks/offload/h100_s2.sh
