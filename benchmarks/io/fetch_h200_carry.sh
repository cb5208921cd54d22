#!/usr/bin/env bash
# Builds the folder that benchmarks/io/lane_h200.sh carries to the GPU machine (no network there, no fio):
#   bin/fio   a static, stripped fio 3.33 built from Debian 12's source package (io_uring engine built in;
#             the engines that need other libraries -- rbd, rados, gfapi, rdma, pmem, nfs, http -- are off)
#   whl/      kvikio-cu13, libkvikio-cu13, rapids-logger for CPython 3.12 (the GPU image already holds
#             cuda-pathfinder and nvidia-cufile)
# About 7 MB. Run on the Debian 12 CPU machine (root, gcc, make), in the checkout the device call sends:
#   bash benchmarks/io/fetch_h200_carry.sh [FOLDER]      (default .carry-io, git-ignored here)
# then name FOLDER in the device call's carry. Building fio takes a few minutes on 2 cores.
set -euo pipefail
DIR=${1:-.carry-io}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$DIR/bin" "$DIR/whl"
DIR=$(cd "$DIR" && pwd)
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx "/$(basename "$DIR")/" "$exclude" 2>/dev/null || echo "/$(basename "$DIR")/" >> "$exclude"
if [ ! -x "$DIR/bin/fio" ]; then
  src=$(mktemp -d /tmp/carina-fio-src-XXXX)
  list=/etc/apt/sources.list.d/carina-io-src.sources
  if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n%s\n' \
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$list"
    apt-get update -qq
  fi
  (cd "$src" && apt-get source --download-only fio=3.33-3 >/dev/null && tar xzf fio_3.33.orig.tar.gz)
  (cd "$src/fio-3.33" && ./configure --build-static --disable-native --disable-numa --disable-rdma \
    --disable-rados --disable-rbd --disable-http --disable-gfapi --disable-libnfs --disable-pmem \
    --disable-xnvme --disable-libzbc --disable-tcmalloc --disable-dfs >/dev/null && nice make -j"$(nproc)" >/dev/null)
  strip -o "$DIR/bin/fio" "$src/fio-3.33/fio"
  rm -rf "$src"
fi
"$DIR/bin/fio" --version
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR/whl" kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 rapids-logger==0.3.0
du -sh "$DIR"
