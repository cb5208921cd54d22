#!/usr/bin/env bash
# Builds the folder benchmarks/gnn/lane_h200.sh carries to the GPU machine in case its image lacks PyG
# (no network there): torch_geometric 2.8.1 (pure Python) and its pure-Python or cp312 dependencies, numpy
# left out (the image has it). The lane installs from it only if `import torch_geometric` fails. A few MB.
# Run in the checkout the device call sends:   bash benchmarks/gnn/fetch_h200_carry.sh [FOLDER]
# (default .whl-gnn, git-ignored through .git/info/exclude)
set -euo pipefail
DIR=${1:-.whl-gnn}
PY=${PYTHON:-/work/main/.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$DIR"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx "/$(basename "$DIR")/" "$exclude" 2>/dev/null || echo "/$(basename "$DIR")/" >> "$exclude"
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR" torch_geometric==2.8.1
rm -f "$DIR"/numpy-*.whl
ls -la "$DIR"
du -sh "$DIR"
