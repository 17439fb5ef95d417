#!/usr/bin/env bash
# On the GPU machine: execute every plan solved by plan_all.sh (carried in experiments/plans/gpu)
# and the baselines (first-touch, LRU, offload, all-fast, torch autograd, torch save_on_cpu),
# measuring iteration times and peaks.
# Usage: bash experiments/gpu/measure_all.sh OUT.csv [MODEL...]   (default: every model)
set -u
. experiments/gpu/setup.sh
. experiments/gpu/configs.sh
output=$1; shift
models=("$@"); [ ${#models[@]} -gt 0 ] || models=("${MODELS[@]}")
for model in "${models[@]}"; do
  set -- ${CFG[$model]}
  echo "== $model $*"
  python3 -m autotm_py bench --models "$model" --batch "$1" "${@:2}" --training --device cuda \
      --ratios "$(ratios_of "$model")" --strategies sync,async --solvers highs \
      --time-limit 150 --plans experiments/plans/gpu --execute --iterations 5 --warmup 2 \
      --no-progress -o "$output" 2>&1 | grep -vE "^(INFO|WARNING)" | tail -3
done
