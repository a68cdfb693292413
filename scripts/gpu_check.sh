#!/usr/bin/env bash
# The GPU check (issue 23): the workbench at the real model's size on one GPU, in one run and one
# report (OUT_DIR/gpu_check.json and gpu_check.txt). See docs/gpu_check.md.
#
#   scripts/gpu_check.sh OUT_DIR               on a CUDA GPU (random bf16 weights from the real config)
#   scripts/gpu_check.sh --cpu-smoke OUT_DIR   the same steps on the CPU with narrow widths (CI)
#
# On the lent GPU machine (no network) the wheels that scripts/prepare_gpu_wheels.sh put in
# .gpu-wheels/ are installed into a private folder first (--no-index --no-deps --target), so its
# own torch stays and transformers is the workbench's. Exits 1 when a step failed (the report
# still lists every step), 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [[ -x .venv/bin/python && -z "${G4V_GPU_CHECK_SYSTEM_PYTHON:-}" && "${1:-}" == "--cpu-smoke" ]]; then
  PYTHON=.venv/bin/python  # here and in CI the smoke run uses the project's environment
fi
ARGS=("$@")
if [[ ${#ARGS[@]} -eq 0 || "${ARGS[-1]}" == --* ]]; then
  echo "usage: scripts/gpu_check.sh [--cpu-smoke] OUT_DIR" >&2
  exit 2
fi
WHEELS="${G4V_GPU_WHEELS:-.gpu-wheels}"
if [[ "${1:-}" != "--cpu-smoke" && -d "$WHEELS" ]] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE="$(mktemp -d)/site"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PYTHON" scripts/gpu_check.py "${ARGS[@]}"
