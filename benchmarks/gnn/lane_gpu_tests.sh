#!/usr/bin/env bash
# carina.gnn's gpu-marked tests alone on the device (session 12): the host paths, the cache lookup with ids on
# either device, the sampler's own stream. PyG from the carried .whl-gnn when the image lacks it (as
# lane_h200.sh does). HARD LIMIT: the lane's; about 25 s (PyG install ~11 s, tests ~11 s in session 12).
# Usage (repository root, carry .whl-gnn): OUT=<dir> bash benchmarks/gnn/lane_gpu_tests.sh   -> $OUT/gnn_tests/log.txt
set -u
PY=${PYTHON:-python3}
mkdir -p "$OUT/gnn_tests"
LOG="$OUT/gnn_tests/log.txt"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
if ! $PY -c "import torch_geometric" 2>/dev/null; then
  PIP_BREAK_SYSTEM_PACKAGES=1 $PY -m pip install -q --no-index --find-links .whl-gnn torch_geometric 2>&1 | tail -2 ||
    true
  $PY -c "import torch_geometric" 2>/dev/null || {
    $PY -m pip install -q --no-index --no-deps --target /tmp/site-gnn .whl-gnn/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-gnn; }
fi
$PY -c "import torch_geometric, torch; print('torch_geometric', torch_geometric.__version__, 'torch', torch.__version__)" |
  tee "$LOG"
$PY -m pytest -q -m gpu -p no:cacheprovider -rA tests/gnn/test_store.py tests/memory/test_mapped.py \
  tests/gnn/test_costmodel.py tests/gnn/test_train.py tests/gnn/test_sampler.py tests/gnn/test_hostread.py 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
