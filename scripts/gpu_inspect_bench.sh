#!/usr/bin/env bash
# The deepstack inspector benchmark on a GPU: random weights built from the real
# granite-vision-4.1-4b config (assets/granite-vision-4.1-4b-config), in bf16. Same compute and
# memory traffic as the real model, so the time and memory ratios are real.
#
#   scripts/gpu_inspect_bench.sh [OUT_DIR]
#
# Needs: a CUDA GPU with ~12 GiB free, torch with CUDA, transformers with granite4_vision (>= 5.19;
# if the machine's is older, set G4V_TRANSFORMERS_WHEEL to a transformers wheel file to install it
# into a private folder first), matplotlib/pillow/safetensors are NOT needed.
# Writes OUT_DIR/inspect_bench_gpu.json and OUT_DIR/inspect_bench_gpu.txt (default OUT_DIR: $OUT or .).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-.}}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"

if ! "$PYTHON" -c "import transformers.models.granite4_vision" 2>/dev/null; then
  if [[ -z "${G4V_TRANSFORMERS_WHEEL:-}" ]]; then
    echo "error: this transformers has no granite4_vision; set G4V_TRANSFORMERS_WHEEL=path/to/transformers-5.23.0-py3-none-any.whl" >&2
    exit 1
  fi
  SITE="$(mktemp -d)/site"
  "$PYTHON" -m pip install -q --no-deps --target "$SITE" "$G4V_TRANSFORMERS_WHEEL"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))" \
  | tee "$OUT_DIR/inspect_bench_gpu.txt"
# A 768 x 1536 picture: 2 x 4 tiles + base view on the real config (1320 image tokens).
"$PYTHON" -m g4v.inspect.bench --models real larger --device cuda --dtype bfloat16 \
  --image-size "${G4V_IMAGE_SIZE:-768x1536}" --repeats "${G4V_REPEATS:-10}" \
  --json "$OUT_DIR/inspect_bench_gpu.json" 2>&1 | grep -v '^Loading' | tee -a "$OUT_DIR/inspect_bench_gpu.txt"
