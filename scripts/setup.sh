#!/usr/bin/env bash
# Set up glm5 for development on a fresh machine: a virtual environment in .venv with torch
# (a CPU build where there is no NVIDIA GPU, so no several-GB CUDA download) and glm5[dev,proof].
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Optional system tools the agent uses when present (ripgrep for grep, bubblewrap for the command sandbox).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! { command -v rg && command -v bwrap; } >/dev/null 2>&1; then
  { apt-get update -qq && apt-get install -y -qq ripgrep bubblewrap; } >/dev/null 2>&1 \
    || echo "note: could not install ripgrep/bubblewrap; glm5 code falls back to Python grep and no sandbox"
fi
# `glm5 bench --env docker`: Debian's Docker daemon and debootstrap (scripts/build_base_image.sh builds the offline
# base image with it); the tests start dockerd when none runs. Skipped where not root or no apt.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v dockerd >/dev/null 2>&1 \
    && [ -z "${GLM5_NO_DOCKER:-}" ]; then
  { apt-get update -qq && apt-get install -y -qq docker.io debootstrap; } >/dev/null 2>&1 \
    || echo "note: could not install docker.io; glm5 bench --env docker needs a Docker daemon"
fi
VENV=${GLM5_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    $PIP install "torch>=2.4"
  else
    # A CPU build: the pinned release where a local wheel cache has it (PIP_FIND_LINKS),
    # else the PyTorch CPU index.
    $PIP install "torch==2.13.0" 2>/dev/null \
      || $PIP install torch --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
  fi
fi
$PIP install -e ".[dev,proof]"  # proof: matplotlib, for `glm5 bench proof` plots
# The real sglang and vLLM packages (.venv-engines, parsers and request classes only: no CUDA needed) that
# tests/serve/test_engine_contracts.py checks glm5's launch commands and RL requests with; GLM5_NO_ENGINES=1 skips it.
if [ -z "${GLM5_NO_ENGINES:-}" ]; then
  bash scripts/engines_env.sh || echo "note: could not build .venv-engines; the engine contract tests will skip"
fi
echo "glm5 is set up: activate with 'source $VENV/bin/activate', or run $VENV/bin/glm5"
