#!/usr/bin/env bash
# Install what carina needs on a fresh Debian machine, idempotently:
#   Debian packages (when root), a virtual environment in .venv, torch (the pinned
#   CPU wheel where no torch is present), carina with all extras, and with --test
#   the development tools.
# Usage: bash tools/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

want_dev=0
[ "${1:-}" = "--test" ] && want_dev=1

APT_PACKAGES=(
  python3-venv git
  qemu-system-x86 qemu-utils qemu-system-common qemu-block-extra ipxe-qemu
  linux-image-cloud-amd64 busybox-static
  tgt nbdkit libnbd-bin python3-libnbd nbd-client fio mmdebstrap pciutils
  e2fsprogs xfsprogs dosfstools lvm2 fdisk rpm
  openscap-scanner openscap-utils ssg-debian db5.3-util
)

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "setup: not root (or no apt-get): skipping Debian packages; 'carina doctor' lists what is missing"
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade "pip>=25.1"
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0"
  "$VPY" -m pip install -q "torch==2.13.0"
fi
"$VPY" -m pip install -q -e ".[all]"
if [ "$want_dev" = 1 ]; then
  "$VPY" -m pip install -q --group dev
fi
echo "setup: ready ($("$VPY" -c 'import carina, torch; print("carina", carina.__version__, "torch", torch.__version__)'))"
