#!/usr/bin/env bash
# Download the wheels that scripts/gpu_check.sh installs on the lent GPU machine, which has no
# network: requirements-gpu-check.txt, for Python 3.12 on manylinux x86_64, without dependencies
# (the machine's own torch, numpy and pillow stay). Run it here, before asking for the machine.
#
#   scripts/prepare_gpu_wheels.sh [DIR]      (default: .gpu-wheels, ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.gpu-wheels}"
LIMIT_MIB=64  # what may travel with the tree to the device machine
PYTHON="${PYTHON:-python3}"
mkdir -p "$DIR"
"$PYTHON" -m pip download --isolated --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --dest "$DIR" -r requirements-gpu-check.txt
SIZE_MIB=$(( $(du -sk "$DIR" | cut -f1) / 1024 ))
echo "$DIR: $(ls "$DIR" | wc -l) wheels, ${SIZE_MIB} MiB"
if (( SIZE_MIB >= LIMIT_MIB )); then
  echo "error: $DIR is ${SIZE_MIB} MiB, over the ${LIMIT_MIB} MiB that may travel to the GPU machine" >&2
  exit 1
fi
