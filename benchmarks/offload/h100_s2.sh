#!/usr/bin/env bash
# S2 on one H100: a 7B-shape Llama (hidden 4096, MLP 11008, 32 heads, vocab 32000; 16 of its 32 layers,
# 3.50B parameters: the largest depth whose host state fits 125 GB of RAM, see below) under a 24 GiB GPU
# cap at 8k and 32k tokens/step with carina.offload, the unlimited-memory ideal (layer truncation) and
# the roofline, FSDP2 CPUOffloadPolicy at 8k as the peer, and, if time is left, the 3B "no tax" row.
#
#   OUT=<dir> bash benchmarks/offload/h100_s2.sh                 # H100: records in $OUT/offload/
#   DEVICE=cpu OUT=/tmp/offload_out bash benchmarks/offload/h100_s2.sh   # tiny sizes, proves the script
#   PHASES="ideal carina_8k cpu_optim" BUDGET=200 OUT=<dir> bash benchmarks/offload/h100_s2.sh   # those phases
#   DRY_RUN=1 PHASES="ideal carina_8k" BUDGET=200 bash benchmarks/offload/h100_s2.sh   # the plan only (any machine)
# Preflight (the table and plan() below): a device run refuses to start (exit 2) when a wanted phase would be
# skipped or cut short of its typical H200 duration under BUDGET; DRY_RUN=1 prints the plan, FORCE=1 overrides.
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
# HARD TIME BUDGET: 430 s in total (BUDGET; 200 s is enough for PHASES="ideal carina_8k"). Every step runs under `timeout`; a step gets at most its
# own cap and never more than what is left of the budget minus the report's reserve; a step that
# cannot get its minimum is skipped and its row says so.
# Why 16 layers: carina kept 20 B/param in host RAM (fp32 master 4, fp32 grad 4, bf16 staging 2, bf16 copy 2,
# AdamW 8) when this was written, so the full 6.74B model needed 135 GB > the RAM. With the gradient fold and the
# parameter cast on the device (the defaults since), it is 16 B/param at one micro-batch (18 with micro-batches
# added on the host): 108 GB for the full model, plus the activations swapped while profiling, still too close to
# a 128 GB machine's RAM for a budgeted run. 16 layers: 56-70 GB of state. The ideal is also extrapolated to 32 layers.
set -uo pipefail
BUDGET=${BUDGET:-430}   # 430: what the preflight below needs for the default PHASES (420 until session 9)
RESERVE=25          # seconds kept for the final report
DEVICE=${DEVICE:-cuda}
PHASES=${PHASES:-"ideal carina_8k carina_32k fsdp2_8k notax_3b"}
OPTIM_THREADS=${OPTIM_THREADS:-0}
# M32: sequences per micro-batch at 32k tokens/step. 16 (one micro-batch, no accumulation) is what
# `carina offload plan --tokens-per-step 32768` recommends for the 7B16L shape under the 24 GiB cap (predicted
# 1.70 s against 2.61 s for 4 micro-batches of 8k: with accumulation the CPU update overlaps only the last
# backward); M32=4 reruns session 5's split.
M32=${M32:-16}
SPILL_LAYERS=${SPILL_LAYERS:-4}; SPILL_BLOCKS=${SPILL_BLOCKS:-2}; NVME_DIR=${NVME_DIR:-/tmp/carina_nvme}
want() { [[ " $PHASES " == *" $1 "* ]]; }

# The phases in the order they run; per phase its cap (CAP: its timeout at most), its minimum (MIN: skipped
# when the budget leaves less) and its typical duration on the H200 (TYP, seconds; 0: none logged, its cap stands in).
ORDER=(gpu_tests ideal carina_8k carina_32k carina_128k fsdp2_8k spill_8k notax_3b cpu_optim)
declare -A CAP MIN TYP
if [ "$DEVICE" = cpu ]; then
  CAP=([gpu_tests]=60 [ideal]=60 [carina_8k]=90 [carina_32k]=90 [carina_128k]=90 [fsdp2_8k]=60 [spill_8k]=60
       [notax_3b]=90 [cpu_optim]=60); NOTAX_MIN=30
else
  CAP=([gpu_tests]=60 [ideal]=60 [carina_8k]=150 [carina_32k]=150 [carina_128k]=170 [fsdp2_8k]=90 [spill_8k]=90
       [notax_3b]=120 [cpu_optim]=40); NOTAX_MIN=100
fi
CAP[spill_8k]=${SPILL_CAP:-${CAP[spill_8k]}}
MIN=([gpu_tests]=20 [ideal]=20 [carina_8k]=60 [carina_32k]=60 [carina_128k]=80 [fsdp2_8k]=45 [spill_8k]=45
     [notax_3b]=$NOTAX_MIN [cpu_optim]=20)
# TYP: the longest `== <phase>: rc=0 in N s` line of the committed H200 logs in
# benchmarks/results/h200/s8/offload_s8_phases.tar.gz and benchmarks/results/h200/s9/offload_s9_phases.tar.gz
# (at M32=16, M128=8): gpu_tests 25, 31; ideal 15, 16, 18, 19, 25;
# carina_8k 63, 71; carina_32k 72 (plain loss), 65, 74 (HEAD_CHUNK=4096); carina_128k 117; spill_8k at the
# full 7B (SPILL_LAYERS=32, SPILL_BLOCKS=27) 408, 426: scaled here by SPILL_LAYERS/32 from 426 s (an estimate:
# only the 32-layer spill finished in those logs). notax_3b is in neither: 82 s and 34 s in
# benchmarks/results/h200/s6/offload_s6_phases.tar.gz and s7/offload_s7_phases.tar.gz (the longer kept).
# fsdp2_8k and cpu_optim ran in no committed H200 log: 0, their cap stands in. A chunked head changes only
# 32k's figure (8k and 128k keep the plain-loss ones: no chunked-head 8k or 128k ran).
TYP=([gpu_tests]=31 [ideal]=25 [carina_8k]=71 [carina_32k]=72 [carina_128k]=117 [fsdp2_8k]=0
     [spill_8k]=$(( (426 * SPILL_LAYERS + 31) / 32 )) [notax_3b]=82 [cpu_optim]=0)
[ "${HEAD_CHUNK:-0}" != 0 ] && TYP[carina_32k]=74
STEP_GAP=6   # the same logs: 3-6 s from a phase's end to the next one's start (the report after each phase)

# The preflight: each wanted phase's timeout if every earlier one runs for its typical duration, and the
# smallest BUDGET that gives every one its typical duration. DRY_RUN=1 prints it and exits (0, or 2 where
# the run would refuse); without it a run refuses to start (exit 2) when a wanted phase would be skipped or
# cut short of its typical duration, unless FORCE=1 or DEVICE=cpu (the durations are the H200's).
# LANE_LIMIT_S (set by benchmarks/h100_combined.sh: the lane's limit) must exceed BUDGET by 5 s.
active() { want "$1" && { [ "$DEVICE" != cpu ] || [[ $1 != gpu_tests && $1 != fsdp2_8k ]]; }; }
plan() {  # plan VERBOSE: sets PLAN_NEED (the smallest BUDGET, "" where no BUDGET does) and PLAN_BAD ("" if none)
  local name at=0 full_at=0 start avail t typ need how verdict
  PLAN_NEED=0; PLAN_BAD=""; PLAN_FIX=""
  for name in "${ORDER[@]}"; do
    active "$name" || continue
    typ=${TYP[$name]}; how="typical $typ s"
    (( typ > 0 )) || { typ=${CAP[$name]}; how="no H200 log, its cap assumed"; }
    need=$(( typ > MIN[$name] ? typ : MIN[$name] ))   # to run at all, and for its typical duration
    if (( CAP[$name] < need )); then PLAN_NEED=""
    elif [ -n "$PLAN_NEED" ] && (( full_at + need + RESERVE + 15 > PLAN_NEED )); then
      PLAN_NEED=$(( full_at + need + RESERVE + 15 ))
    fi
    full_at=$(( full_at + typ + STEP_GAP ))
    start=$at; avail=$(( BUDGET - at - RESERVE - 15 )); t=$(( CAP[$name] < avail ? CAP[$name] : avail ))
    if (( t < MIN[$name] )); then verdict="skipped (timeout $t s < its minimum ${MIN[$name]} s)"
    elif (( t < typ )); then verdict="cut short (timeout $t s < its typical $typ s)"; at=$(( at + t + STEP_GAP ))
    else verdict="runs"; at=$(( at + typ + STEP_GAP ))
    fi
    if (( CAP[$name] < need )); then
      verdict="$verdict: its cap ${CAP[$name]} s is below $need s$([ "$name" = spill_8k ] && echo ", set SPILL_CAP")"
    fi
    [ "$verdict" != runs ] && [ -z "$PLAN_BAD" ] && PLAN_BAD="$name would be $verdict"
    if (( $1 )); then
      printf '== plan %-12s at +%3d s: timeout %3d s, minimum %3d s, %s: %s\n' \
        "$name" "$start" "$t" "${MIN[$name]}" "$how" "$verdict"
    fi
  done
  if [ -z "$PLAN_BAD" ] && [ -n "${LANE_LIMIT_S:-}" ] && (( BUDGET + 5 > LANE_LIMIT_S )); then
    PLAN_BAD="the lane's limit (${LANE_LIMIT_S} s) would stop it"; PLAN_FIX="a lane limit >= $(( BUDGET + 5 )) s"
  fi
}
PLAN_BAD=""
if [ "${DRY_RUN:-0}" = 1 ] || [ "$DEVICE" != cpu ]; then
  [ "${DRY_RUN:-0}" = 1 ] && echo "== plan (dry run, nothing runs): phases $PHASES; BUDGET $BUDGET s (a timeout" \
    "leaves $RESERVE + 15 s of it), $STEP_GAP s between phases; typical: the H200 logs' durations (the table in" \
    "h100_s2.sh)$([ "$DEVICE" = cpu ] && echo ", not enforced on DEVICE=cpu")"
  plan "$([ "${DRY_RUN:-0}" = 1 ] && echo 1 || echo 0)"
  SMALLEST="${PLAN_NEED:-none (a cap is too small)}"; NEED="a larger cap (no BUDGET is enough)"
  [ -n "$PLAN_NEED" ] && SMALLEST="$PLAN_NEED s" && NEED="BUDGET >= $PLAN_NEED s"
  [ -n "$PLAN_FIX" ] && NEED=$PLAN_FIX
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "== plan: the smallest BUDGET that gives every wanted phase its typical duration: $SMALLEST" \
      "(this one: $BUDGET s)${PLAN_BAD:+; $PLAN_BAD}"
  fi
  if [ -n "$PLAN_BAD" ] && [ "$DEVICE" != cpu ] && [ "${FORCE:-0}" != 1 ]; then
    echo "h100_s2.sh: refusing to start (exit 2) under BUDGET=$BUDGET: $PLAN_BAD; it needs $NEED" \
      "(FORCE=1 starts it anyway; DRY_RUN=1 prints the plan)" >&2
    exit 2
  fi
  [ "${DRY_RUN:-0}" = 1 ] && exit 0
fi

OUT=${OUT:?set OUT}
DIR="$OUT/${LANE:-offload}"   # LANE: the folder under $OUT (benchmarks/h100_combined.sh packs $OUT/<lane>)
WORK=${WORK:-$DIR}   # each phase's JSON lands next to the records as soon as the phase ends (never /tmp)
mkdir -p "$DIR" "$WORK"
rm -f "$WORK"/ideal.json "$WORK"/carina_*.json "$WORK"/fsdp2_*.json "$WORK"/notax_*.json "$WORK"/spill_*.json
LOG="$DIR/s2.log"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if [ "$DEVICE" = cpu ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
B="$PY benchmarks/offload/bench_s2.py"
START=$(date +%s)

if [ "$DEVICE" = cpu ]; then   # tiny sizes: proves every phase and the report
  # no cap here: --resident off keeps the carina phases offloading (the notax phase plans resident mode itself)
  COMMON="--device cpu --model tiny --layers 4 --truncate 2,4 --seq 64 --micro 2 --cap 0 --host-budget 0 --adam-probe 1048576 --tag tiny --resident off"
  T8=256; T32=1024; T128=4096; M128=16; NOTAX="--model tiny --layers 4"
  export OMP_NUM_THREADS=1   # a shared CPU box: one intra-op thread keeps timings sane
  KMODEL=tiny; SPILL_TAG=tiny; DISK_PROBE=$((64 << 20))
else
  COMMON="--model llama2-7b --layers 16 --seq 2048 --micro 4 --cap 24 --host-budget 110 --tag 7b16l"
  T8=8192; T32=32768; T128=131072; M128=${M128:-8}; NOTAX="--model llama-3b --layers 26 --micro 1"
  KMODEL=llama2-7b; SPILL_TAG=7b${SPILL_LAYERS}l; DISK_PROBE=$((4 << 30))  # 4 GiB: past a write cache (s8 probed 1 GiB)
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
if want gpu_tests && [ "$DEVICE" != cpu ]; then   # the GPU paths' correctness tests first
  step gpu_tests "${CAP[gpu_tests]}" "${MIN[gpu_tests]}" bash -c "$PY -m pytest -q -p no:cacheprovider -m gpu tests/offload/test_cuda.py 2>&1 \
    | tee '$DIR/gpu_tests.txt' | tail -15"
fi
want ideal      && step ideal      "${CAP[ideal]}" "${MIN[ideal]}" $B ideal  --work "$WORK" $COMMON
want carina_8k  && step carina_8k  "${CAP[carina_8k]}" "${MIN[carina_8k]}" $B carina --work "$WORK" $COMMON $CARINA --tokens $T8 --steps 3
want carina_32k && step carina_32k "${CAP[carina_32k]}" "${MIN[carina_32k]}" $B carina --work "$WORK" $COMMON $CARINA --tokens $T32 --steps 2 \
  --micro "$M32"
# 128k: 8 micro-batches of 8 sequences, the split `carina offload plan --tokens-per-step 131072` takes (M128)
want carina_128k && step carina_128k "${CAP[carina_128k]}" "${MIN[carina_128k]}" $B carina --work "$WORK" $COMMON $CARINA --tokens $T128 \
  --steps 2 --micro "$M128"
[ "$DEVICE" != cpu ] && want fsdp2_8k && step fsdp2_8k "${CAP[fsdp2_8k]}" "${MIN[fsdp2_8k]}" $B fsdp2 --work "$WORK" $COMMON --tokens $T8 --steps 2
want spill_8k   && step spill_8k   "${CAP[spill_8k]}" "${MIN[spill_8k]}" $B spill  --work "$WORK" $COMMON $CARINA --layers "$SPILL_LAYERS" \
  --tokens $T8 --steps 2 --spill-blocks "$SPILL_BLOCKS" --nvme-path "$NVME_DIR" --disk-probe "$DISK_PROBE"
rm -rf "$NVME_DIR"   # the tier removes its file; a killed phase may leave it
want notax_3b   && step notax_3b   "${CAP[notax_3b]}" "${MIN[notax_3b]}" $B notax --work "$WORK" $COMMON $NOTAX --tokens $T8 --steps 3
want cpu_optim  && step cpu_optim  "${CAP[cpu_optim]}" "${MIN[cpu_optim]}" $PY benchmarks/offload/bench_cpu_optimizer.py --kernels-only \
  --model $KMODEL --rounds 3 --reps 3 --out "$DIR"
# the final report always runs, inside the reserve
report $(( RESERVE - 5 ))
echo "== total $(( $(date +%s) - START )) s of the $BUDGET s budget" | tee -a "$LOG"
ls "$DIR"
cat "$DIR/summary.md" 2>/dev/null
