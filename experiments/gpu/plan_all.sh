#!/usr/bin/env bash
# Solve every GPU benchmark plan on this (CPU) machine with the shipped H100 profiles, keeping
# the plans in experiments/plans/gpu so that the GPU machine only executes them:
#   bash experiments/gpu/plan_all.sh            (here)
#   bash experiments/gpu/measure_all.sh ...     (on the GPU machine)
# HEADROOMS="0 0.05 0.1" also solves each cell with that share of the budget left free for the
# allocator's fragmentation (the plans `autotm bench --execute --fit` falls back to).
set -eu
. experiments/gpu/configs.sh
OUTPUT=${OUTPUT:-experiments/results/gpu_plans.csv}
for headroom in ${HEADROOMS:-0}; do
  # rows are keyed without the headroom: one CSV per headroom keeps the sweeps apart
  output=$OUTPUT; [ "$headroom" = 0 ] || output=${TMPDIR:-/tmp}/gpu_plans_h$headroom.csv
  for model in "${MODELS[@]}"; do
    set -- ${CFG[$model]}
    autotm bench --models "$model" --batch "$1" "${@:2}" --training --device cuda \
        --ratios "$(ratios_of "$model")" --strategies sync,async --solvers highs \
        --time-limit 150 --headroom "$headroom" --plans experiments/plans/gpu --no-progress \
        -o "$output"
  done
done
