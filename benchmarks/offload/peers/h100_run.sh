#!/usr/bin/env bash
# The peer comparison on the GPU machine, from the repository root:
#   OUT=<results dir> bash benchmarks/offload/peers/h100_run.sh [preset]
# DeepSpeed (an sdist) and torchao travel as files in .whl/; DeepSpeed's CPU Adam JIT-builds on first use.
set -uo pipefail
PRESET=${1:-h100-1b}
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 DS_SKIP_CUDA_CHECK=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/deepspeed-*.tar.gz 2>&1 | tail -3
python3 -c "import deepspeed, torchao; print('deepspeed', deepspeed.__version__, 'torchao', torchao.__version__)"
timeout 480 python3 benchmarks/offload/peers/harness.py --preset "$PRESET" --timeout 200 --out "$OUT"
