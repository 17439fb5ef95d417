#!/usr/bin/env bash
# On the GPU machine: execute every plan solved by plan_all.sh (carried in experiments/plans/gpu)
# and the baselines (first-touch, LRU, offload, all-fast, torch autograd, torch save_on_cpu),
# measuring iteration times and peaks. Usage: bash experiments/gpu/measure_all.sh OUT.csv MODELS...
# where each MODEL is one of the configurations below by name.
set -u
. experiments/gpu/setup.sh
output=$1; shift
declare -A CFG=(
  [inception_v4]="64" [resnet200]="32" [densenet264]="32" [vgg19]="64"
  [bert_base]="16 --dim seq=512" [gpt2_small]="8 --dim seq=1024"
)
for model in "$@"; do
  set -- ${CFG[$model]}
  echo "== $model $*"
  python3 -m autotm_py bench --models "$model" --batch "$1" "${@:2}" --training --device cuda \
      --ratios 1:1,1:2,1:3 --strategies sync,async --solvers highs --time-limit 150 \
      --plans experiments/plans/gpu --execute --iterations 5 --warmup 2 --no-progress \
      -o "$output" 2>&1 | grep -vE "^(INFO|WARNING)" | tail -3
done
