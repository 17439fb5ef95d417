#!/usr/bin/env bash
# Solve the arena plans that experiments/gpu/arena_check.py measures, on this (CPU) machine with
# the shipped H100 profiles (PuLP and HiGHS are not on the GPU machine):
#   bash experiments/gpu/plan_arena.sh [MODEL...]        (default: resnet200 bert_base)
# Each cell (50% and 25% of the peak, async, HiGHS) is solved twice: `--arena` (kernels priced
# at their in-context times, for eager runs) and `--arena --graph` (device times, for CUDA-graph
# replay). Plans go to experiments/plans/arena/MODEL_RATIO_arena[_graph].json.gz.
set -eu
. experiments/gpu/configs.sh
PLANS=${PLANS:-experiments/plans/arena}
TIME_LIMIT=${TIME_LIMIT:-150}
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(resnet200 bert_base)
mkdir -p "$PLANS"
for model in "${models[@]}"; do
  set -- ${CFG[$model]}
  for ratio in 1:1 1:3; do
    for graph in "" --graph; do
      name="$PLANS/${model}_${ratio/:/-}_arena${graph:+_graph}.json.gz"
      [ -e "$name" ] && { echo "have $name"; continue; }
      echo "== $name"
      python3 -m autotm_py optimize "$model" --training --batch "$1" "${@:2}" --device cuda \
          --ratio "$ratio" --strategy async --solver highs --time-limit "$TIME_LIMIT" \
          --arena $graph --no-baselines -o "$name" | grep -E "predicted|arena|wrote|error"
    done
  done
done
