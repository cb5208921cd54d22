#!/usr/bin/env bash
# carina.io follow-up on the H100 machine: out-of-core GEMM and external sort, records into $OUT
# (two files: io_gemm_h100.json, io_sort_h100.json; output goes to stdout).
# Sized for about 50 s (under 100 s even at half that speed) on a disk of ~1.5 GB/s with ~64 GB free (peak scratch use ~6 GB):
#   GEMM n=12288, tile 4096, bf16 + TF32: A and B are 0.6 GB (bf16) / 1.2 GB (fp32) against a 352/512 MB
#   device budget (C panel + 5 tile slots); sort: 2 GB of uint64 keys under a 512 MB budget.
# Usage (repository root): OUT=<dir> bash benchmarks/io/h100_followup.sh
# Every size is an environment variable, so the same script runs on a CPU with tiny sizes, e.g.
#   DEVICE=cpu GEMM_N=512 GEMM_TILE=128 SORT_SIZE=8M SORT_BUDGET=2M OUT=/tmp/o bash benchmarks/io/h100_followup.sh
set -euo pipefail
: "${OUT:?set OUT to the folder the records go to}"
export PYTHONPATH=src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT"
DEVICE=${DEVICE:-cuda}
GEMM_N=${GEMM_N:-12288}
GEMM_TILE=${GEMM_TILE:-4096}
SORT_SIZE=${SORT_SIZE:-2G}
SORT_BUDGET=${SORT_BUDGET:-512M}
SCRATCH=${SCRATCH:-.}            # a folder on the disk under test (the repository's disk by default)
FIO=${FIO:-}                    # fio binary; empty: fio from PATH, else threaded O_DIRECT reads/writes
CEILING_S=${CEILING_S:-1.5}
SUFFIX=${SUFFIX:-_h100}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
start=$(date +%s)
status=0
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
fi
df -h "$SCRATCH" | tail -1

echo "== out-of-core GEMM ($DEVICE, n=$GEMM_N, tile=$GEMM_TILE)"
"$PYTHON" benchmarks/io/bench_gemm.py --device "$DEVICE" --n "$GEMM_N" --tile "$GEMM_TILE" --dtypes bf16,fp32 \
  --dir "$SCRATCH" --fio "$FIO" --ceiling-seconds "$CEILING_S" --name "io_gemm$SUFFIX" --out "$OUT" \
  || status=1
echo "gemm done after $(($(date +%s) - start)) s"

echo "== external sort ($DEVICE, $SORT_SIZE under $SORT_BUDGET)"
"$PYTHON" benchmarks/io/bench_sort.py --device "$DEVICE" --size "$SORT_SIZE" --budget "$SORT_BUDGET" \
  --dir "$SCRATCH" --fio "$FIO" --ceiling-seconds "$CEILING_S" --name "io_sort$SUFFIX" --out "$OUT" \
  || status=1
echo "io follow-up done after $(($(date +%s) - start)) s (status $status)"
exit "$status"
