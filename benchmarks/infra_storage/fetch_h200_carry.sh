#!/usr/bin/env bash
# Builds the folder that benchmarks/infra_storage/h200.sh carries to the GPU machine (no network there), ~30 MB:
#   * qemu-img (Debian 12 qemu-utils) and the libraries it links, as .deb files (the ldd closure minus glibc);
#   * the lz4 wheel for CPython 3.12;
#   * nVIDIA nvCOMP for CUDA 13 and CPython 3.12 as one .tar.xz: from the PyPI wheels nvidia-nvcomp-cu13 and
#     nvidia-libnvcomp-cu13 (6.0.0.12), only the files that `from nvidia import nvcomp` loads (the cp312 extension,
#     libnvcomp.so.6, the two packages' Python files and licences), xz-compressed: the wheels (34 MB) do not fit the
#     device call's 64 MiB next to the working tree. h200.sh unpacks it into /tmp and puts it on PYTHONPATH.
# Run on the (Debian 12) CPU machine, in the checkout the device call sends:
#   bash benchmarks/infra_storage/fetch_h200_carry.sh [FOLDER]      (default .debs-storage, git-ignored here)
# then name FOLDER in the device call's carry. Files already there are kept.
set -euo pipefail
DIR=${1:-.debs-storage}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
NVCOMP=6.0.0.12
mkdir -p "$DIR"
grep -qx "/$DIR/" "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null || echo "/$DIR/" >> "$(git rev-parse --git-common-dir)/info/exclude"
ls "$DIR"/qemu-utils_*.deb >/dev/null 2>&1 || (cd "$DIR" && apt-get download qemu-utils libaio1 libglib2.0-0 libgmp10 \
  libgnutls30 libhogweed6 libnettle8 libidn2-0 libnuma1 libp11-kit0 libpcre2-8-0 libtasn1-6 libunistring2 liburing2 \
  libzstd1 zlib1g libffi8)
PIP=("$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
ls "$DIR"/lz4-*.whl >/dev/null 2>&1 || "${PIP[@]}" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR" lz4==4.4.5
TAR="$DIR/nvcomp-cu13-$NVCOMP-cp312.tar.xz"
if [ ! -f "$TAR" ]; then
  T=$(mktemp -d)
  "${PIP[@]}" --platform manylinux_2_28_x86_64 -d "$T" "nvidia-nvcomp-cu13==$NVCOMP" "nvidia-libnvcomp-cu13==$NVCOMP"
  for w in "$T"/*.whl; do "$PY" -m zipfile -e "$w" "$T/x"; done
  (cd "$T/x" && tar -cJf "$OLDPWD/$TAR.part" nvidia/libnvcomp/__init__.py nvidia/libnvcomp/load.py \
    nvidia/libnvcomp/lib64 nvidia/libnvcomp/LICENSE nvidia/libnvcomp/NOTICE nvidia/nvcomp/__init__.py \
    nvidia/nvcomp/external_memory.py nvidia/nvcomp/nvcomp_impl.cpython-312-x86_64-linux-gnu.so \
    nvidia_nvcomp_cu13-$NVCOMP.dist-info/licenses)
  mv "$TAR.part" "$TAR"
  rm -rf "$T"
fi
du -sh "$DIR"
