#!/usr/bin/env bash
# Builds the folder that benchmarks/infra_storage/h200.sh carries to the GPU machine (no network there):
# qemu-img (Debian 12 qemu-utils) and the libraries it links, as .deb files, plus the lz4 wheel for CPython 3.12.
# About 8 MB. Run on the (Debian 12) CPU machine, in the checkout the device call sends:
#   bash benchmarks/infra_storage/fetch_h200_carry.sh [FOLDER]      (default .debs-storage, git-ignored here)
# then name FOLDER in the device call's carry. The library list is qemu-img's ldd closure minus glibc.
set -euo pipefail
DIR=${1:-.debs-storage}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$DIR"
grep -qx "/$DIR/" "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null || echo "/$DIR/" >> "$(git rev-parse --git-common-dir)/info/exclude"
(cd "$DIR" && apt-get download qemu-utils libaio1 libglib2.0-0 libgmp10 libgnutls30 libhogweed6 libnettle8 libidn2-0 \
  libnuma1 libp11-kit0 libpcre2-8-0 libtasn1-6 libunistring2 liburing2 libzstd1 zlib1g libffi8)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR" lz4==4.4.5
du -sh "$DIR"
