#!/usr/bin/env bash
# On the GPU machine (issue 13 item 5): run the joint keep/move/recompute plans carried in
# experiments/plans/recompute (solved on the CPU machine by plan_recompute.sh) next to all-fast
# and activation checkpointing under the same cap, and write OUT_DIR/recompute_check.json,
# .txt (the table) and .log. Needs python3 with torch and onnx (torchvision / transformers for
# the native checkpointing rows, skipped without them); no PuLP or solver: it never plans.
# Carried wheels (.whl/), if any, are installed as experiments/gpu/setup.sh does.
# Device time: no new measurement starts after BUDGET_S (default 400 s), and a model's process
# is stopped 60 s after its share; what was skipped is listed in the JSON.
# Usage: [MATCH='*arena_graph'] bash experiments/gpu/recompute_check.sh OUT_DIR [MODELS]
#   MATCH: only the plan files MODEL_<MATCH>.json* (default: all); PLANS: their folder;
#   EXTRA: more options of recompute_check.py (e.g. --no-ours)
#   MODELS: comma-separated, in order of importance (default resnet200,bert_base,inception_v4,
#   densenet264,gpt2_small; models without carried plans are skipped)
set -u
out=${1:?usage: bash experiments/gpu/recompute_check.sh OUT_DIR [MODELS]}
models=${2:-resnet200,bert_base,inception_v4,densenet264,gpt2_small}
if ls .whl/*.whl >/dev/null 2>&1; then . experiments/gpu/setup.sh || exit 1; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
# every model in a process of its own (a failed capture or a leaked pool stays in its model's
# runs), each given what is left of BUDGET_S; then one results file and table
start=$(date +%s)
for model in ${models//,/ }; do
  left=$(( ${BUDGET_S:-400} - ($(date +%s) - start) ))
  if [ "$left" -lt 30 ]; then echo "skipped $model (device time budget)"; continue; fi
  timeout --signal=INT --kill-after=10 $(( left + 60 )) \
      python3 experiments/gpu/recompute_check.py "$out/$model" --models "$model" \
      --plans "${PLANS:-experiments/plans/recompute}" --match "${MATCH:-*}" \
      --iterations "${ITERATIONS:-5}" --budget-s "$left" ${EXTRA:-} 2>&1 | grep -v "^WARNING"
done 2>&1 | tee "$out/recompute_check.log"
python3 experiments/gpu/recompute_check.py "$out" --merge
