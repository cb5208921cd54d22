#!/usr/bin/env bash
# S2 on one H100: a 7B-shape Llama (hidden 4096, MLP 11008, 32 heads, vocab 32000; 16 of its 32 layers,
# 3.50B parameters: the largest depth whose host state fits 125 GB of RAM, see below) under a 24 GiB GPU
# cap at 8k and 32k tokens/step with carina.offload, the unlimited-memory ideal (layer truncation) and
# the roofline, FSDP2 CPUOffloadPolicy at 8k as the peer, and, if time is left, the 3B "no tax" row.
#
#   OUT=<dir> bash benchmarks/offload/h100_s2.sh                 # H100: records in $OUT/offload/
#   DEVICE=cpu OUT=/tmp/offload_out bash benchmarks/offload/h100_s2.sh   # tiny sizes, proves the script
#   PHASES="ideal carina_8k cpu_optim" BUDGET=200 OUT=<dir> bash benchmarks/offload/h100_s2.sh   # those phases
#
# PHASES (default: all but cpu_optim, spill_8k, carina_128k and gpu_tests) picks among: ideal carina_8k carina_32k carina_128k fsdp2_8k
# notax_3b cpu_optim spill_8k gpu_tests (gpu_tests: tests/offload/test_cuda.py, first, its summary in gpu_tests.txt) and
# spill_8k (spill_8k: the 7B shape at SPILL_LAYERS (4) layers, 8k tokens, a host budget SPILL_BLOCKS (2)
# blocks' optimizer state short of the plan's need, so that state spills to the NVMe tier in NVME_DIR; the tier's
# write/read rates are measured first and are the disk roofline; record offload_s2_7b4l_spill_8k.json)
# (cpu_optim: bench_cpu_optimizer.py --kernels-only, fused CPU AdamW over one 7B block with all threads or
# one fewer, quiet or beside one busy thread, per-parameter tensors or one flat tensor; its record is
# offload_cpu_optimizer_kernels_llama2-7b.json, written as soon as it ends); the report then writes
# records only for the carina configurations that ran. The script runs on any CUDA machine (an H200 too):
# carina.core.bench labels the records with the machine it ran on; record names carry no machine name.
# Each carina record holds metrics.step_split_s (the step's split: compute, recompute, waits on weights,
# activations and the CPU optimizer, the step tail) and metrics.optim_rates (the CPU optimizer's rate in
# the timed steps vs the same updates alone in the same process). OPTIM_THREADS sets carina's optimizer
# worker threads (0: auto). HEAD_CHUNK=N (default 0: the plain loss) runs the carina phases' loss through
# carina.offload.chunked_lm_loss in chunks of N tokens (bench_s2.py --head-chunk-tokens; the records'
# metrics.carina.head_chunk_tokens says which ran, and their names carry _head<N> after the tag).
#
# HARD TIME BUDGET: 420 s in total (BUDGET; 200 s is enough for PHASES="ideal carina_8k"). Every step runs under `timeout`; a step gets at most its
# own cap and never more than what is left of the budget minus the report's reserve; a step that
# cannot get its minimum is skipped and its row says so.
# Why 16 layers: carina kept 20 B/param in host RAM (fp32 master 4, fp32 grad 4, bf16 staging 2, bf16 copy 2,
# AdamW 8) when this was written, so the full 6.74B model needed 135 GB > the RAM. With the gradient fold and the
# parameter cast on the device (the defaults since), it is 16 B/param at one micro-batch (18 with micro-batches
# added on the host): 108 GB for the full model, plus the activations swapped while profiling, still too close to
# a 128 GB machine's RAM for a budgeted run. 16 layers: 56-70 GB of state. The ideal is also extrapolated to 32 layers.
set -uo pipefail
BUDGET=${BUDGET:-420}
RESERVE=25          # seconds kept for the final report
OUT=${OUT:?set OUT}
DIR="$OUT/${LANE:-offload}"   # LANE: the folder under $OUT (benchmarks/h100_combined.sh packs $OUT/<lane>)
WORK=${WORK:-$DIR}   # each phase's JSON lands next to the records as soon as the phase ends (never /tmp)
mkdir -p "$DIR" "$WORK"
rm -f "$WORK"/ideal.json "$WORK"/carina_*.json "$WORK"/fsdp2_*.json "$WORK"/notax_*.json "$WORK"/spill_*.json
LOG="$DIR/s2.log"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if [ "${DEVICE:-cuda}" = cpu ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
B="$PY benchmarks/offload/bench_s2.py"
PHASES=${PHASES:-"ideal carina_8k carina_32k fsdp2_8k notax_3b"}
OPTIM_THREADS=${OPTIM_THREADS:-0}
# M32: sequences per micro-batch at 32k tokens/step. 16 (one micro-batch, no accumulation) is what
# `carina offload plan --tokens-per-step 32768` recommends for the 7B16L shape under the 24 GiB cap (predicted
# 1.70 s against 2.61 s for 4 micro-batches of 8k: with accumulation the CPU update overlaps only the last
# backward); M32=4 reruns session 5's split.
M32=${M32:-16}
SPILL_LAYERS=${SPILL_LAYERS:-4}; SPILL_BLOCKS=${SPILL_BLOCKS:-2}; NVME_DIR=${NVME_DIR:-/tmp/carina_nvme}
want() { [[ " $PHASES " == *" $1 "* ]]; }
START=$(date +%s)

if [ "${DEVICE:-cuda}" = cpu ]; then   # tiny sizes: proves every phase and the report
  # no cap here: --resident off keeps the carina phases offloading (the notax phase plans resident mode itself)
  COMMON="--device cpu --model tiny --layers 4 --truncate 2,4 --seq 64 --micro 2 --cap 0 --host-budget 0 --adam-probe 1048576 --tag tiny --resident off"
  T8=256; T32=1024; T128=4096; M128=16; NOTAX="--model tiny --layers 4"
  export OMP_NUM_THREADS=1   # a shared CPU box: one intra-op thread keeps timings sane
  CAPS=(60 90 90 60 90 60 60 90); NOTAX_MIN=30; KMODEL=tiny; SPILL_TAG=tiny; DISK_PROBE=$((64 << 20))
else
  COMMON="--model llama2-7b --layers 16 --seq 2048 --micro 4 --cap 24 --host-budget 110 --tag 7b16l"
  T8=8192; T32=32768; T128=131072; M128=${M128:-8}; NOTAX="--model llama-3b --layers 26 --micro 1"
  CAPS=(60 150 150 90 120 40 90 170); NOTAX_MIN=100; KMODEL=llama2-7b   # ideal, carina 8k/32k, fsdp2, no tax, cpu_optim, spill, 128k
  SPILL_TAG=7b${SPILL_LAYERS}l; DISK_PROBE=$((4 << 30))  # 4 GiB: past a write cache (s8 probed 1 GiB)
fi

# a chunked head names its records apart (offload_s2_<tag>_head<N>_<tokens>.json): bench_s2.py takes the last --tag
[ "${HEAD_CHUNK:-0}" != 0 ] && COMMON="$COMMON --tag $(sed 's/.*--tag \([^ ]*\).*/\1/' <<<"$COMMON")_head$HEAD_CHUNK"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # step NAME CAP MIN cmd...
  local name=$1 cap=$2 min=$3; shift 3
  local avail=$(( $(left) - RESERVE - 15 ))   # 10 s for the report after the step, 5 s slack
  local t=$(( cap < avail ? cap : avail ))
  if (( t < min )); then
    echo "== $name: skipped ($avail s left of the budget, needs >= $min)" | tee -a "$LOG"; return
  fi
  echo "== $name: timeout $t s (at +$(( $(date +%s) - START )) s)" | tee -a "$LOG"
  local t0=$(date +%s)
  timeout -k 5 "$t" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  report 10   # records of everything measured so far, rewritten after each step
}
REPORT_TOKENS=$( { want carina_8k && echo $T8; want carina_32k && echo $T32; want carina_128k && echo $T128; } | paste -sd, )
report() {  # report SECONDS
  [ -n "$REPORT_TOKENS" ] || want spill_8k || want notax_3b || return 0
  timeout -k 2 "$1" $B report --work "$WORK" --out "$DIR" $COMMON --report-tokens "$REPORT_TOKENS" --tokens $T8 \
    --spill-tag "$SPILL_TAG" >>"$LOG" 2>&1 \
    || echo "== report failed (rc=$?)" | tee -a "$LOG"
}

{ echo "== machine"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null; free -g; df -h /tmp | tail -1; nproc; } >>"$LOG" 2>&1
echo "== phases: $PHASES (budget $BUDGET s)" | tee -a "$LOG"
CARINA="--optim-threads $OPTIM_THREADS --head-chunk-tokens ${HEAD_CHUNK:-0}"
if want gpu_tests && [ "${DEVICE:-cuda}" != cpu ]; then   # the GPU paths' correctness tests first
  step gpu_tests 60 20 bash -c "$PY -m pytest -q -p no:cacheprovider -m gpu tests/offload/test_cuda.py 2>&1 \
    | tee '$DIR/gpu_tests.txt' | tail -15"
fi
want ideal      && step ideal      "${CAPS[0]}" 20 $B ideal  --work "$WORK" $COMMON
want carina_8k  && step carina_8k  "${CAPS[1]}" 60 $B carina --work "$WORK" $COMMON $CARINA --tokens $T8 --steps 3
want carina_32k && step carina_32k "${CAPS[2]}" 60 $B carina --work "$WORK" $COMMON $CARINA --tokens $T32 --steps 2 \
  --micro "$M32"
# 128k: 8 micro-batches of 8 sequences, the split `carina offload plan --tokens-per-step 131072` takes (M128)
want carina_128k && step carina_128k "${CAPS[7]}" 80 $B carina --work "$WORK" $COMMON $CARINA --tokens $T128 \
  --steps 2 --micro "$M128"
[ "${DEVICE:-cuda}" != cpu ] && want fsdp2_8k && step fsdp2_8k "${CAPS[3]}" 45 $B fsdp2 --work "$WORK" $COMMON --tokens $T8 --steps 2
want spill_8k   && step spill_8k   "${SPILL_CAP:-${CAPS[6]}}" 45 $B spill  --work "$WORK" $COMMON $CARINA --layers "$SPILL_LAYERS" \
  --tokens $T8 --steps 2 --spill-blocks "$SPILL_BLOCKS" --nvme-path "$NVME_DIR" --disk-probe "$DISK_PROBE"
rm -rf "$NVME_DIR"   # the tier removes its file; a killed phase may leave it
want notax_3b   && step notax_3b   "${CAPS[4]}" "$NOTAX_MIN" $B notax --work "$WORK" $COMMON $NOTAX --tokens $T8 --steps 3
want cpu_optim  && step cpu_optim  "${CAPS[5]}" 20 $PY benchmarks/offload/bench_cpu_optimizer.py --kernels-only \
  --model $KMODEL --rounds 3 --reps 3 --out "$DIR"
# the final report always runs, inside the reserve
report $(( RESERVE - 5 ))
echo "== total $(( $(date +%s) - START )) s of the $BUDGET s budget" | tee -a "$LOG"
ls "$DIR"
cat "$DIR/summary.md" 2>/dev/null
