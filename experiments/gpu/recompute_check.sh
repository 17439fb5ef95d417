#!/usr/bin/env bash
# On the GPU machine (issue 13 item 5): run the joint keep/move/recompute plans carried in
# experiments/plans/recompute (solved on the CPU machine by plan_recompute.sh) next to all-fast
# and activation checkpointing under the same cap, and write OUT_DIR/recompute_check.json,
# .txt (the table) and .log. Needs python3 with torch and onnx (torchvision / transformers for
# the native checkpointing rows, skipped without them); no PuLP or solver: it never plans.
# Carried wheels (.whl/), if any, are installed as experiments/gpu/setup.sh does.
# Device time: at most LIMIT_S (default 470 s); no new measurement starts after BUDGET_S
# (default 400 s); what was skipped is listed in the JSON.
# Usage: bash experiments/gpu/recompute_check.sh OUT_DIR [MODELS]
#   MODELS: comma-separated, in order of importance (default resnet200,bert_base,inception_v4,
#   densenet264,gpt2_small; models without carried plans are skipped)
set -u
out=${1:?usage: bash experiments/gpu/recompute_check.sh OUT_DIR [MODELS]}
models=${2:-resnet200,bert_base,inception_v4,densenet264,gpt2_small}
if ls .whl/*.whl >/dev/null 2>&1; then . experiments/gpu/setup.sh || exit 1; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
timeout --signal=INT --kill-after=10 "${LIMIT_S:-470}" \
    python3 experiments/gpu/recompute_check.py "$out" --models "$models" \
    --plans experiments/plans/recompute --iterations "${ITERATIONS:-5}" \
    --budget-s "${BUDGET_S:-400}" 2>&1 | grep -v "^WARNING" | tee "$out/recompute_check.log"
