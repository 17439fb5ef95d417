#!/usr/bin/env bash
# Solve the arena plans that experiments/gpu/arena_check.py measures, on this (CPU) machine with
# the shipped H100 profiles (PuLP and HiGHS are not on the GPU machine):
#   [PRICED="eager graph"] bash experiments/gpu/plan_arena.sh [MODEL...]
#   (default models: resnet200 bert_base)
# Each cell (async, HiGHS, 150 s per solve) is solved twice: `--arena` (kernels priced at their
# profiled times, for eager runs) and `--arena --graph` (device times where profiles have them,
# for CUDA-graph replay); PRICED=eager solves the first only. Ratios: 1:1, 1:2 and 1:3 (50, 33
# and 25% of the peak); BERT-base b16 s512 at 1:1 and 1:2, since at 1:3 its loss alone (logits
# and log-probabilities, 1.86 GiB) exceeds the budget; VGG19 at 4:1 and 2:1 (its largest kernel
# needs 61% of its peak). Plans go to experiments/plans/arena/MODEL_RATIO_arena[_graph].json.gz;
# a plan already there is kept (delete it to solve again).
set -u
. experiments/gpu/configs.sh
PLANS=${PLANS:-experiments/plans/arena}
TIME_LIMIT=${TIME_LIMIT:-150}
declare -A ARENA_RATIOS=([bert_base]="1:1 1:2" [vgg19]="4:1 2:1")
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(resnet200 bert_base)
mkdir -p "$PLANS"
for model in "${models[@]}"; do
  set -- ${CFG[$model]}
  for ratio in ${ARENA_RATIOS[$model]:-1:1 1:2 1:3}; do
    for priced in ${PRICED:-eager graph}; do
      graph=""; [ "$priced" = graph ] && graph=--graph
      name="$PLANS/${model}_${ratio/:/-}_arena${graph:+_graph}.json.gz"
      [ -e "$name" ] && { echo "have $name"; continue; }
      echo "== $name"
      python3 -m autotm_py optimize "$model" --training --batch "$1" "${@:2}" --device cuda \
          --ratio "$ratio" --strategy async --solver highs --time-limit "$TIME_LIMIT" \
          --arena $graph --no-baselines -o "$name" 2>&1 \
          | grep -E "predicted|arena|wrote|error|result|=" || true
    done
  done
done
