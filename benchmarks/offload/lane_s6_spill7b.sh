#!/usr/bin/env bash
# The spill configuration on the H200 (a device call of its own): the FULL 7B shape (32 layers, 6.74B
# parameters) under a 24 GiB GPU cap with a host budget SPILL_BLOCKS (27) blocks' optimizer state short of its
# need (~108 GB -> ~65 GB, the "7B with a 64 GB host budget"): ~44 GB of AdamW state on the NVMe tier,
# read and written every step (~88 GB of disk traffic: a disk-bound step of ~40 s at ~2 GB/s). The tier's
# write/read rates (8 tensors in flight, best of 2) are measured first and are the disk roofline.
# HARD TIME BUDGET: 560 s (BUDGET), lane limit 575 s; disk: ~46 GB under NVME_DIR (the device has ~64 GB free).
#   OUT=$OUT bash benchmarks/h100_combined.sh spill7b=benchmarks/offload/lane_s6_spill7b.sh:575
# Proof on a CPU (tiny sizes):  DEVICE=cpu OUT=/tmp/lane_out bash benchmarks/offload/lane_s6_spill7b.sh
# The plan only, on any machine (h100_s2.sh's preflight; SPILL_LAYERS scales the spill's typical duration):
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/h100_combined.sh spill7b=benchmarks/offload/lane_s6_spill7b.sh:575
set -uo pipefail
: "${OUT:?set OUT}"
export OUT LANE=${LANE:-spill7b}
export BUDGET=${BUDGET:-560}
if [ "${DEVICE:-cuda}" = cpu ]; then export SPILL_LAYERS=4 SPILL_BLOCKS=2; else export SPILL_LAYERS=32 SPILL_BLOCKS=27 SPILL_CAP=480; fi
export PHASES=${PHASES:-"ideal spill_8k"}
exec bash benchmarks/offload/h100_s2.sh
