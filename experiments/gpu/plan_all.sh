#!/usr/bin/env bash
# Solve every GPU benchmark plan on this (CPU) machine with the shipped H100 profiles, keeping
# the plans in experiments/plans/gpu so that the GPU machine only executes them:
#   bash experiments/gpu/plan_all.sh            (here)
#   bash experiments/gpu/measure_all.sh ...     (on the GPU machine)
set -eu
. experiments/gpu/configs.sh
OUTPUT=${OUTPUT:-experiments/results/gpu_plans.csv}
for model in "${MODELS[@]}"; do
  set -- ${CFG[$model]}
  autotm bench --models "$model" --batch "$1" "${@:2}" --training --device cuda \
      --ratios "$(ratios_of "$model")" --strategies sync,async --solvers highs \
      --time-limit 150 --plans experiments/plans/gpu --no-progress -o "$OUTPUT"
done
