#!/usr/bin/env bash
# The peer comparison in ONE harness run, as one lane of benchmarks/h100_combined.sh (lane name: peers):
# plain PyTorch uncapped first (the ideal and every system's loss reference), then carina, DeepSpeed ZeRO-3
# offload (ZeRO-Offload, DeepSpeedCPUAdam), FSDP2 CPUOffloadPolicy and torchao's CPUOffloadOptimizer (as is,
# and with offload_gradients=True) on the 1.1B Llama at 8k tokens under an 8 GiB cap (preset h200-1b); the
# summary table and the PNG.
#
# HARD BUDGET: BUDGET=430 s for the whole lane (give the lane >= 440 s): wheels ~10 s; DeepSpeed preflight
# (cpu_adam + async_io JIT builds at once, one use of each) <= 150 s; the harness gets what is left, 100 s
# per system run (expected: calibration 10, carina 55, DeepSpeed 45-60, FSDP2 45, torchao 20 (out of memory),
# torchao with offload_gradients 35, ideal 30: ~340 s in all).
# Every record is written into $OUT/$LANE/ as soon as its step ends (the harness rewrites the table, the
# plot and the records after each system), so a kill loses only what had not run.
#
# Carry (repository root): .whl (torchao 0.18.0) and .whl-ds (DeepSpeed 0.19.8 py3 wheel built with
# DS_BUILD_OPS=0, hjson, pydantic 2.14.4, pydantic-core 2.50.5 cp312, annotated-types, typing-inspection,
# typing-extensions, and Debian 12's libaio1 + libaio-dev .debs, unpacked to a prefix, never to /).
#
# Usage (repository root): OUT=<dir> bash benchmarks/offload/peers/lane_peers_h200.sh
#   the 7B16l lanes set PRESET, LANE, BUDGET, PER_RUN and TAG: lane_peers_h200_7b.sh (8k), _check3b.sh (the 3B
#   loss check), _7b32k.sh, _7b128k.sh, _spill.sh; each states its expected time at its top
#   NVME_DIR=<dir on a disk>: where the aio check writes (O_DIRECT: not tmpfs); NVME=1 adds ZeRO-Infinity
# CPU proof (tiny model, run on the CPU machine; wheels installed beforehand into SITE):
#   DEVICE=cpu PY=/work/main/.venv/bin/python SITE=/tmp/dssite OUT=/tmp/o bash <this script>
set -uo pipefail
: "${OUT:?set OUT}"
T0=$(date +%s)
DEVICE=${DEVICE:-gpu}
LANE=${LANE:-peers}
if [ "$DEVICE" = cpu ]; then
  PRESET=${PRESET:-ci}; BUDGET=${BUDGET:-900}; PER_RUN=${PER_RUN:-400}; PREFLIGHT_S=${PREFLIGHT_S:-400}
else
  PRESET=${PRESET:-h200-1b}; BUDGET=${BUDGET:-430}; PER_RUN=${PER_RUN:-100}; PREFLIGHT_S=${PREFLIGHT_S:-150}
fi
TAG=${TAG-s4}  # every output is named offload_peers_<TAG>_...: this run never overwrites an earlier one
PY=${PY:-python3}
SITE=${SITE:-/tmp/peers-site}
WHL=${WHL:-.whl}
WHL_DS=${WHL_DS:-.whl-ds}
NVME_DIR=${NVME_DIR:-/var/tmp/peers-nvme}
DEST="$OUT/$LANE"
mkdir -p "$DEST" "$NVME_DIR"
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "[lane $LANE $(($(date +%s) - T0))s] $*"; }
export PYTHONPATH="$SITE:$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/peers-torch-ext}
# nvcc 13.0 against torch's CUDA 13.0: DeepSpeed's minor-version check is skipped as on the H100 (session 1).
export DS_SKIP_CUDA_CHECK=1

# 1. Wheels into SITE (skipped when SITE already holds deepspeed: the CPU proof installs its cp311 set first).
if ! PYTHONPATH="$SITE" "$PY" -c "import deepspeed" 2>/dev/null; then
  # shellcheck disable=SC2086
  timeout 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    $(ls "$WHL"/torchao-*.whl 2>/dev/null) "$WHL_DS"/*.whl 2>&1 | tail -3
fi
say "wheels: $(PYTHONPATH="$SITE" "$PY" -c 'import deepspeed, pydantic; print("deepspeed", deepspeed.__version__, "pydantic", pydantic.__version__)' 2>&1 | tail -1)"

# 2. libaio (headers, .so) from the carried .debs into a prefix; gcc reads CPATH/LIBRARY_PATH for the JIT
#    build, DeepSpeed's io_submit probe reads CFLAGS/LDFLAGS.
AIO=/tmp/peers-libaio
for deb in "$WHL_DS"/libaio*.deb; do [ -f "$deb" ] && dpkg -x "$deb" "$AIO"; done
LIB="$AIO/usr/lib/x86_64-linux-gnu"
export CPATH="$AIO/usr/include${CPATH:+:$CPATH}" LIBRARY_PATH="$LIB${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CFLAGS="-I$AIO/usr/include" LDFLAGS="-L$LIB"
say "machine: $(nproc) cores; $(command -v g++ || echo 'no g++'); $(df -T "$NVME_DIR" | tail -1)"
# DeepSpeed's JIT builder sorts the CUDA arch list as integers: session 5's H200 preflight failed async_io with
# "invalid literal for int() with base 10: '0a'" (an arch such as 9.0a in the list). Name the GPU's own arch.
# (GPU_CAP, not CC: session 7's lane kept the arch in CC, and DeepSpeed's libaio probe then ran "9.0" as its
# C compiler: "No such file or directory: '9.0'" in the preflight record.)
if [ "$DEVICE" != cpu ] && GPU_CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1); then
  say "TORCH_CUDA_ARCH_LIST was '${TORCH_CUDA_ARCH_LIST-unset}'; set to $GPU_CAP for DeepSpeed's builds"
  export TORCH_CUDA_ARCH_LIST=$GPU_CAP
fi

# DeepSpeed's libaio probe (AsyncIOBuilder.is_compatible) compiles and links a C program with the C compiler
# Python was built with (or CC) and discards the compiler's words: session 6's H200 preflight failed it with no
# compiler output at all, as when that compiler does not exist. Name one that does (the preflight's record
# has the probe's commands and the compiler's own error text if it still fails); with g++ alone, `g++ -x c`
# (and `-x none` before the link's object file).
PYCC=$("$PY" -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])' 2>/dev/null)
if [ -z "${CC:-}" ] && ! command -v "${PYCC:-cc}" >/dev/null 2>&1; then
  for c in gcc cc clang; do command -v "$c" >/dev/null 2>&1 && { export CC=$c; break; }; done
  if [ -z "${CC:-}" ] && command -v g++ >/dev/null 2>&1; then export CC="g++ -x c" LDFLAGS="-x none $LDFLAGS"; fi
fi
say "C compiler: Python's ${PYCC:-?} ($(command -v "${PYCC:-cc}" || echo absent)); CC=${CC:-unset}"

# Weights: the first system to build the configuration's model saves it, every later one (of this lane and of
# later lanes on this machine) maps it (workload.build_model; bitwise the same model without its ~30 s init).
# On the disk, at most 2 shapes (28 GB); the spill lane needs that disk, so it removes them and caches in
# /dev/shm when there is room there (else builds each time).
WEIGHTS=/var/tmp/peers-weights
if [ "${NVME:-0}" = 1 ]; then
  rm -rf "$WEIGHTS"
  SHM_KB=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
  if [ "${SHM_KB:-0}" -gt $((24 << 20)) ]; then WEIGHTS=/dev/shm/peers-weights; else WEIGHTS=""; fi
fi
export PEERS_WEIGHTS_DIR=${PEERS_WEIGHTS_DIR-$WEIGHTS}
say "weights cache: ${PEERS_WEIGHTS_DIR:-none} ($(du -sh "${PEERS_WEIGHTS_DIR:-/nonexistent}" 2>/dev/null | cut -f1))"

# 3. DeepSpeed preflight: versions, toolchain, cpu_adam and async_io built and used once; its record says
#    what worked or the exact failure, and the harness gives a DeepSpeed row that failure as its reason.
timeout --kill-after=5 $((PREFLIGHT_S + 10)) "$PY" benchmarks/offload/peers/ds_preflight.py --out "$DEST" \
  --aio-dir "$NVME_DIR" --timeout "$PREFLIGHT_S" --tag "$TAG"
say "preflight exit $?"
export PEERS_DS_PREFLIGHT="$DEST/offload_peers_${TAG:+${TAG}_}deepspeed_preflight.json"

# 4. One harness run: every system on the same model, tokens and cap; the ideal and loss reference last.
EXTRA=()
[ "${NVME:-0}" = 1 ] && EXTRA=(--nvme-path "$NVME_DIR")
# HARNESS_ARGS: more harness options, e.g. "--skip-ideal" for a rerun of some systems (the ideal is an earlier run's)
# shellcheck disable=SC2206
[ -n "${HARNESS_ARGS:-}" ] && EXTRA+=(${HARNESS_ARGS})
SYSTEMS=${SYSTEMS:-}
T=$(left); [ "$T" -lt 30 ] && T=30
# shellcheck disable=SC2086
timeout --kill-after=5 "$T" "$PY" benchmarks/offload/peers/harness.py --preset "$PRESET" \
  ${SYSTEMS:+--systems $SYSTEMS} --timeout "$PER_RUN" --budget $((T - 10)) --tag "$TAG" --out "$DEST" "${EXTRA[@]}"
say "harness exit $?"
[ "$PEERS_WEIGHTS_DIR" = /dev/shm/peers-weights ] && rm -rf "$PEERS_WEIGHTS_DIR"  # give the memory back
cat "$DEST"/offload_peers_*summary.md 2>/dev/null
"$PY" - "$DEST" <<'PY' || true
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("offload_peers_*.json")):
    m = json.loads(p.read_text())["metrics"]
    lc = m.get("loss_check") or {}
    print(p.stem, m.get("status"), "loss within:", lc.get("within"), "max diff:", lc.get("max_abs_diff"),
          "drift:", lc.get("drift"), "|", (m.get("reason") or "")[:160])
PY
