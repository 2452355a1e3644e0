#!/usr/bin/env bash
# .venv-engines: the real sglang and vLLM packages, for tests/serve/test_engine_contracts.py, which parses every
# argv glm5 generates with sglang's and vLLM's own parsers and builds every body glm5's RL client sends with
# sglang's own request classes. Both engines need CUDA to run but not to parse: they are installed without their
# dependencies (--no-deps), with the packages their parser and request modules import (scripts/engines-requirements.txt,
# pinned) and a CPU torch; nothing of glm5 is installed here and glm5 never imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GLM5_ENGINES_VENV:-.venv-engines}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # The CPU build, as scripts/setup.sh installs it: a local wheel cache (PIP_FIND_LINKS) or the PyTorch CPU index.
  $PIP install -q --no-deps "torch==2.13.0" 2>/dev/null \
    || $PIP install -q --no-deps "torch==2.13.0" --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
fi
$PIP install -q --no-deps -r scripts/engines-requirements.txt
echo "engines environment ready: $VENV (sglang $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))'), vllm $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))'))"
