# Sourced by the storage device lanes (h200.sh, h200_frontends.sh): the carried tools made by fetch_h200_carry.sh.
# In: PYTHON, DEBS (lz4 wheel, nvCOMP tarball, qemu .debs), NVCOMP_WHL (optional folder of nvCOMP wheels).
# Out: PYTHONPATH extended with the unpacked wheels, NVCOMP=1 when `from nvidia import nvcomp` works (else 0),
# QEMU = a qemu-img to run (the .debs unpacked behind a wrapper, $QEMU_IMG, or the one on PATH), or empty.
W=$(mktemp -d /tmp/carina-whl-XXXX)
if ! "$PYTHON" -c "import lz4.block" 2>/dev/null && ls "$DEBS"/lz4-*.whl >/dev/null 2>&1; then
  for w in "$DEBS"/lz4-*.whl; do timeout 20 "$PYTHON" -m zipfile -e "$w" "$W"; done
fi
if ! "$PYTHON" -c "from nvidia import nvcomp" 2>/dev/null; then
  for t in "$DEBS"/nvcomp-*.tar.xz; do [ -f "$t" ] && timeout 30 tar -xJf "$t" -C "$W"; done
  for w in "${NVCOMP_WHL:-.whl-nvcomp}"/*.whl; do [ -f "$w" ] && timeout 30 "$PYTHON" -m zipfile -e "$w" "$W"; done
fi
export PYTHONPATH="$PYTHONPATH:$W"
"$PYTHON" -c "import lz4.block; print('lz4', lz4.__version__)" 2>/dev/null || echo "lz4: not importable"
NVCOMP=0
"$PYTHON" -c "from nvidia import nvcomp; print('nvcomp', nvcomp.__version__, 'cuda', nvcomp.__cuda_version__)" \
  2>/dev/null && NVCOMP=1 || echo "nvcomp: not importable (the nvcomp system is left out)"
QEMU=${QEMU_IMG:-}
if [ -z "$QEMU" ] && ls "$DEBS"/qemu-utils_*.deb >/dev/null 2>&1; then
  P=$(mktemp -d /tmp/carina-qemu-XXXX)
  for f in "$DEBS"/*.deb; do timeout 20 dpkg-deb -x "$f" "$P"; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/usr/lib/x86_64-linux-gnu:%s/lib/x86_64-linux-gnu exec %s/usr/bin/qemu-img "$@"\n' \
    "$P" "$P" "$P" > "$P/qemu-img.sh"
  chmod +x "$P/qemu-img.sh"
  "$P/qemu-img.sh" --version | head -1 && QEMU="$P/qemu-img.sh"
fi
[ -z "$QEMU" ] && QEMU=$(command -v qemu-img || true)
