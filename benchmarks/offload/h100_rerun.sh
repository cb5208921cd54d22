#!/usr/bin/env bash
# carina beside FSDP2 CPU offload and the plain-PyTorch ideal on the 1.1B Llama at 8k tokens under the 8 GiB
# cap (peers harness preset h100-1b), then carina.offload's GPU tests.
# Time budget: at most 380 s (harness 330 s hard limit, 150 s per system run; GPU tests 40 s).
# Estimated for the H100 (scaled from the S2 7B-shape record: init 11 s, wrap 20 s, profiling 37 s at 3.5B;
# never measured as a whole: call 3's harness printed nothing before its 150 s limit
# killed it): calibrate ~10 s, carina ~60-90 s (1.1B init on the CPU, wrap, 2 profiling steps, 1 planned
# warm-up step, 3 timed steps), FSDP2 ~40 s, ideal (plain, uncapped) ~30 s.
# Each system's record, the table and the plot land in $OUT/peers as soon as that system finishes, and the
# harness prints one line per run (outcome, step times, wall time) to $OUT/peers/harness.log.
# From the repository root: OUT=<dir> bash benchmarks/offload/h100_rerun.sh   (DEVICE=cpu: tiny CPU preset)
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
mkdir -p "$OUT/peers"
pack() { tar -C "$OUT" -czf "$OUT/results.tgz" peers 2>/dev/null; }
trap pack EXIT
if [ "${DEVICE:-cuda}" = cpu ]; then
  ARGS=(--preset ci --systems carina plain fsdp2_cpu_offload --timeout 150)
else
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  ARGS=(--preset h100-1b --systems carina fsdp2_cpu_offload --timeout 150)
fi
start=$(date +%s)
timeout --kill-after=5 330 "$PY" benchmarks/offload/peers/harness.py "${ARGS[@]}" --out "$OUT/peers" 2>&1 \
  | tee "$OUT/peers/harness.log" | grep '^\[harness\]'
echo "peers harness: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
pack
cat "$OUT/peers/offload_peers_summary.md" 2>/dev/null
if [ "${DEVICE:-cuda}" != cpu ]; then
  timeout 40 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/offload 2>&1 | tail -30 > "$OUT/peers/offload_gpu_tests.txt"
  tail -3 "$OUT/peers/offload_gpu_tests.txt"
fi
