#!/usr/bin/env bash
# Solve every GPU benchmark plan on this (CPU) machine with the shipped H100 profiles, keeping
# the plans in experiments/plans/gpu so that the GPU machine only executes them:
#   bash experiments/gpu/plan_all.sh            (here)
#   bash experiments/gpu/measure_all.sh         (on the GPU machine)
set -eu
OUTPUT=${OUTPUT:-experiments/results/gpu_plans.csv}
for cfg in "inception_v4 64" "resnet200 32" "densenet264 32" "vgg19 64" \
           "bert_base 16 --dim seq=512" "gpt2_small 8 --dim seq=1024"; do
  set -- $cfg
  autotm bench --models "$1" --batch "$2" "${@:3}" --training --device cuda \
      --ratios 1:1,1:2,1:3 --strategies sync,async --solvers highs --time-limit 150 \
      --plans experiments/plans/gpu --no-progress -o "$OUTPUT"
done
