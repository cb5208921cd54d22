#!/usr/bin/env bash
# The peers' spill configuration: the 7B shape cut to 16 layers (3.50B parameters), 24 GiB cap, 8k tokens, and
# a 36 GiB HOST budget, under the optimizer state (fp32 masters + both AdamW states: 39.1 GiB; preset
# h200-7b16l-spill). carina takes Config(host_budget, nvme_path, nvme_budget): its plan moves most blocks' AdamW
# state to NVMe; DeepSpeed ZeRO-Infinity puts offload_param and offload_optimizer on NVMe (its async_io op is
# JIT-built by the preflight with TORCH_CUDA_ARCH_LIST set); DeepSpeed ZeRO-Offload, FSDP2 and torchao have no
# NVMe tier and are rows with that reason (16 B a parameter in host memory). Each system spills into its own
# folder under NVME_DIR, removed after it; the record has the disk's free bytes before the run, its peak host RSS
# against the budget, and the usual loss check. A device call of its own, best as the last peers lane of
# the session: it removes the weights cache from the disk (ZeRO-Infinity needs that disk) and caches in
# /dev/shm when there is room. HARD BUDGET 575 s (lane limit 585 s): preflight (cpu_adam + async_io) ~15 s
# with cpu_adam built by an earlier lane (~70 cold), calibration 9, the ideal (plain, uncapped; the loss
# reference) ~55, carina (disk-bound steps of ~20 s) ~120, ZeRO-Infinity what is left (300 s per run at most);
# the three peers without an NVMe tier are rows without a process. 3 warm-up steps and 1 timed. Disk:
# ZeRO-Infinity swaps ~16 B a parameter of fp32 state plus the bf16 weights (~60 GB) under NVME_DIR: a full
# disk is its row's reason. Carry .whl and .whl-ds. Records: offload_peers_s7_7b16l_8192tok_24g_host36g_*.
#   OUT=$OUT bash benchmarks/h100_combined.sh peersspill=benchmarks/offload/peers/lane_peers_h200_spill.sh:585
# CPU proof (preset ci-spill: a small model, a host budget under its optimizer state, NVMe in /var/tmp):
#   DEVICE=cpu PY=/work/main/.venv/bin/python SITE=/tmp/dssite OUT=/tmp/o bash <this script>
set -uo pipefail
if [ "${DEVICE:-gpu}" = cpu ]; then export PRESET=${PRESET:-ci-spill}  # the base lane's CPU budgets
else export PRESET=${PRESET:-h200-7b16l-spill} BUDGET=${BUDGET:-575} PER_RUN=${PER_RUN:-300}; fi
export LANE=${LANE:-peersspill}
export TAG=${TAG-s7} NVME=1
exec bash "$(dirname "$0")/lane_peers_h200.sh"
