#!/usr/bin/env bash
# On the GPU machine, one command: planned addresses, CUDA-graph replay, all-fast and native
# PyTorch for ResNet-200, BERT-base and DenseNet-264 (experiments/gpu/arena_check.py; the plans
# come solved from experiments/gpu/plan_arena.sh). Needs python3 with torch and onnx (and
# torchvision and transformers for the native rows); PuLP is not needed. Carried wheels in .whl
# are installed if there are any (experiments/gpu/setup.sh).
# Usage: bash experiments/gpu/arena_check.sh OUT_DIR [arena_check.py options]
set -u
out=${1:?usage: arena_check.sh OUT_DIR [options]}; shift
if compgen -G ".whl/*.whl" > /dev/null; then
  . experiments/gpu/setup.sh || exit 1
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 experiments/gpu/arena_check.py "$out" "$@" 2>&1 | grep -v "^WARNING" \
    | tee "$out/arena_check.log"
