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
# PHASES (default: all but cpu_optim) picks among: ideal carina_8k carina_32k fsdp2_8k notax_3b cpu_optim
# (cpu_optim: bench_cpu_optimizer.py --kernels-only, fused CPU AdamW over one 7B block with all threads or
# one fewer, quiet or beside one busy thread, per-parameter tensors or one flat tensor; its record is
# offload_cpu_optimizer_kernels_llama2-7b.json, written as soon as it ends); the report then writes
# records only for the carina configurations that ran. The script runs on any CUDA machine (an H200 too):
# carina.core.bench labels the records with the machine it ran on; record names carry no machine name.
# Each carina record holds metrics.step_split_s (the step's split: compute, recompute, waits on weights,
# activations and the CPU optimizer, the step tail) and metrics.optim_rates (the CPU optimizer's rate in
# the timed steps vs the same updates alone in the same process). OPTIM_THREADS sets carina's optimizer
# worker threads (0: auto).
#
# HARD TIME BUDGET: 420 s in total (BUDGET; 200 s is enough for PHASES="ideal carina_8k"). Every step runs under `timeout`; a step gets at most its
# own cap and never more than what is left of the budget minus the report's reserve; a step that
# cannot get its minimum is skipped and its row says so.
# Why 16 layers: carina keeps 20 B/param in host RAM (fp32 master 4, fp32 grad 4, bf16 staging 2,
# bf16 copy 2, AdamW 8), so the full 6.74B model needs 135 GB (+ activations swapped while profiling)
# > 125 GB; it would have to spill >= 35 GB of optimizer state to the ~1.5 GB/s disk (>= 47 s of disk
# traffic per step), which this budget cannot hold. 16 layers: 70 GB of state + ~25 GB of swapped
# activations during profiling. The ideal is also extrapolated to the full 32 layers in each record.
set -uo pipefail
BUDGET=${BUDGET:-420}
RESERVE=25          # seconds kept for the final report
OUT=${OUT:?set OUT}
DIR="$OUT/offload"
WORK=${WORK:-$DIR}   # each phase's JSON lands next to the records as soon as the phase ends (never /tmp)
mkdir -p "$DIR" "$WORK"
rm -f "$WORK"/ideal.json "$WORK"/carina_*.json "$WORK"/fsdp2_*.json "$WORK"/notax_*.json
LOG="$DIR/s2.log"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if [ "${DEVICE:-cuda}" = cpu ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
B="$PY benchmarks/offload/bench_s2.py"
PHASES=${PHASES:-"ideal carina_8k carina_32k fsdp2_8k notax_3b"}
OPTIM_THREADS=${OPTIM_THREADS:-0}
want() { [[ " $PHASES " == *" $1 "* ]]; }
START=$(date +%s)

if [ "${DEVICE:-cuda}" = cpu ]; then   # tiny sizes: proves every phase and the report
  COMMON="--device cpu --model tiny --layers 4 --truncate 2,4 --seq 64 --micro 2 --cap 0 --host-budget 0 --adam-probe 1048576 --tag tiny"
  T8=256; T32=1024; NOTAX="--model tiny --layers 4"
  export OMP_NUM_THREADS=1   # a shared CPU box: one intra-op thread keeps timings sane
  CAPS=(60 90 90 60 90 60); NOTAX_MIN=30; KMODEL=tiny
else
  COMMON="--model llama2-7b --layers 16 --seq 2048 --micro 4 --cap 24 --host-budget 110 --tag 7b16l"
  T8=8192; T32=32768; NOTAX="--model llama-3b --layers 26 --micro 1"
  CAPS=(60 150 150 90 120 40); NOTAX_MIN=100; KMODEL=llama2-7b   # ideal, carina 8k/32k, fsdp2, no tax, cpu_optim
fi

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
REPORT_TOKENS=$( { want carina_8k && echo $T8; want carina_32k && echo $T32; } | paste -sd, )
report() {  # report SECONDS
  [ -n "$REPORT_TOKENS" ] || return 0
  timeout -k 2 "$1" $B report --work "$WORK" --out "$DIR" $COMMON --report-tokens "$REPORT_TOKENS" --tokens $T8 >>"$LOG" 2>&1 \
    || echo "== report failed (rc=$?)" | tee -a "$LOG"
}

{ echo "== machine"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null; free -g; df -h /tmp | tail -1; nproc; } >>"$LOG" 2>&1
echo "== phases: $PHASES (budget $BUDGET s)" | tee -a "$LOG"
CARINA="--optim-threads $OPTIM_THREADS"
want ideal      && step ideal      "${CAPS[0]}" 20 $B ideal  --work "$WORK" $COMMON
want carina_8k  && step carina_8k  "${CAPS[1]}" 60 $B carina --work "$WORK" $COMMON $CARINA --tokens $T8 --steps 3
want carina_32k && step carina_32k "${CAPS[2]}" 60 $B carina --work "$WORK" $COMMON $CARINA --tokens $T32 --steps 2
[ "${DEVICE:-cuda}" != cpu ] && want fsdp2_8k && step fsdp2_8k "${CAPS[3]}" 45 $B fsdp2 --work "$WORK" $COMMON --tokens $T8 --steps 2
want notax_3b   && step notax_3b   "${CAPS[4]}" "$NOTAX_MIN" $B notax --work "$WORK" $COMMON $NOTAX --tokens $T8 --steps 3
want cpu_optim  && step cpu_optim  "${CAPS[5]}" 20 $PY benchmarks/offload/bench_cpu_optimizer.py --kernels-only \
  --model $KMODEL --rounds 3 --reps 3 --out "$DIR"
# the final report always runs, inside the reserve
report $(( RESERVE - 5 ))
echo "== total $(( $(date +%s) - START )) s of the $BUDGET s budget" | tee -a "$LOG"
ls "$DIR"
cat "$DIR/summary.md" 2>/dev/null
