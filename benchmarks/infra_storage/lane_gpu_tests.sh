#!/usr/bin/env bash
# carina.infra.storage's device tests alone (session 13): the torch engine's ZVC batches on CUDA against the
# CPU bit for bit (test_storage_zvc_plan.py's gpu test, test_payload_engines.py's CUDA cases). hypothesis and
# zstandard from the carried .whl-hyp, lz4 from .debs-storage, when the image lacks them. First ran in session 14
# on an H100 (h100/s14/storage_gpu_tests.log); on the 2-core CPU machine the two files take 6 s (CUDA skipped).
# Usage (repository root, carry .whl-hyp): OUT=<dir> bash benchmarks/infra_storage/lane_gpu_tests.sh
#   -> $OUT/storage_tests/log.txt
set -u
PY=${PYTHON:-python3}
mkdir -p "$OUT/storage_tests"
LOG="$OUT/storage_tests/log.txt"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
if ! $PY -c "import hypothesis" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site-hyp .whl-hyp/*.whl 2>&1 | tail -2
  export PYTHONPATH=$PYTHONPATH:/tmp/site-hyp
fi
# the CPU pools' codecs (s14 H100: four pool tests failed on the image's missing lz4 and zstandard)
if ! $PY -c "import lz4, zstandard" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site-codecs .debs-storage/lz4-*.whl .whl-hyp/zstandard-*.whl 2>&1 | tail -2
  export PYTHONPATH=$PYTHONPATH:/tmp/site-codecs
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$LOG"
$PY -m pytest -q -p no:cacheprovider -rA tests/infra/storage/test_storage_zvc_plan.py \
  tests/infra/storage/test_payload_engines.py 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
