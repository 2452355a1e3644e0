#!/usr/bin/env bash
# glm5's own engine on one CUDA GPU (an H200), in one run of under 10 minutes: benchmarks/gpu_check.py on the `small`
# preset and a real-width cut-down GLM-5 (3 layers at hidden 6144, 256 experts top-8, MLA 2048/512, the indexer,
# MTP; random weights, ~64 GB bf16): logits against the plain path, decode and prefill as a share of the HBM and
# bf16 FLOP bounds, INT4 and MTP. Results: benchmarks/gpu_check.json (and $OUT/gpu_check.json when $OUT is set).
#
# The GPU machine reaches nothing outside it. It needs a Python with a CUDA torch; the few pure-Python packages
# glm5's model and engine import besides (safetensors, tqdm, dill, numpy) are installed from benchmarks/gpu_wheels/
# when missing. Fill that folder first, on a machine with the package index:
#     bash benchmarks/gpu_check.sh --prepare      (pip download; then carry benchmarks/gpu_wheels with the tree)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=benchmarks/gpu_wheels
NEEDED="safetensors tqdm dill numpy"
if [ "${1:-}" = "--prepare" ]; then
  "$PY" -m pip download -q --only-binary=:all: -d "$WHEELS" $NEEDED
  ls "$WHEELS"
  exit 0
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA device')"
for pkg in $NEEDED; do
  "$PY" -c "import $pkg" 2>/dev/null || "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$pkg"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 560 "$PY" benchmarks/gpu_check.py --out benchmarks/gpu_check.json "$@"
if [ -n "${OUT:-}" ]; then cp benchmarks/gpu_check.json "$OUT/"; fi
