#!/usr/bin/env bash
# One device call: the H100 records of infra.cluster (node checks), offload.disagg (interference)
# and ckpt (training stall). Run from the repository root on the GPU machine:
#   OUT=<results dir> bash benchmarks/h100_lead.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT" NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
echo "== cluster node checks"
timeout 90 python3 benchmarks/infra_cluster/bench_node.py --path /tmp --out "$OUT" || echo "cluster: exit $?"
echo "== disagg interference"
timeout 60 python3 benchmarks/offload/disagg/bench_interference.py --seconds 4 || echo "interference: exit $?"
echo "== ckpt stall"
timeout 150 python3 benchmarks/ckpt/bench_stall.py --device cuda --params 3e8 --reps 3 \
  --writers thread,fork,process --threads 8 --budget-s 120 --dir /tmp/ckpt-bench --name ckpt_stall_h100 \
  || echo "ckpt: exit $?"
ls -la "$OUT"
