#!/usr/bin/env bash
# Builds the folder that benchmarks/offload/peers/lane_peers_h200*.sh carry to the GPU machine for DeepSpeed
# (no network there, no DeepSpeed): DeepSpeed 0.19.8 as a py3 wheel built from its sdist with DS_BUILD_OPS=0
# (its C++ sources ride along; the lane's preflight JIT-builds cpu_adam and async_io there), the packages
# the GPU image lacks for CPython 3.12 (hjson, pydantic 2.14.4, pydantic-core 2.50.5, annotated-types,
# typing-inspection, typing-extensions), and Debian 12's libaio1 + libaio-dev .debs (the lane unpacks them
# into a prefix, never into /). About 5 MB. Run on the Debian 12 CPU machine, in the checkout the device
# call sends:   bash benchmarks/offload/peers/fetch_h200_carry.sh [FOLDER]   (default .whl-ds, git-ignored)
set -euo pipefail
DIR=${1:-.whl-ds}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx "/$(basename "$DIR")/" "$exclude" 2>/dev/null || echo "/$(basename "$DIR")/" >> "$exclude"
if ! ls "$DIR"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
  src=$(mktemp -d /tmp/carina-ds-XXXX)
  "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$src" deepspeed==0.19.8
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$src"/deepspeed-0.19.8.tar.gz
fi
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR" \
  hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0
(cd "$DIR" && apt-get download -q libaio1 libaio-dev >/dev/null)
ls -la "$DIR"
