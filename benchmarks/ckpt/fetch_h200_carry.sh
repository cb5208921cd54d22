#!/usr/bin/env bash
# Builds the folder benchmarks/ckpt/lane_h200_s4.sh carries to the GPU machine: the isal wheel (ISA-L's
# CRC-32 for carina.ckpt's checksums, carina.ckpt.checksum) for CPython 3.12. 0.3 MB. Run in the checkout
# the device call sends:   bash benchmarks/ckpt/fetch_h200_carry.sh [FOLDER]   (default .whl-ckpt, git-ignored)
set -euo pipefail
DIR=${1:-.whl-ckpt}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$DIR"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx "/$(basename "$DIR")/" "$exclude" 2>/dev/null || echo "/$(basename "$DIR")/" >> "$exclude"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR" isal==1.9.1
ls -la "$DIR"
