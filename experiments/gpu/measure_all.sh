#!/usr/bin/env bash
# On the GPU machine: execute every plan solved by plan_all.sh (carried in experiments/plans/gpu)
# and the baselines (first-touch, LRU, offload, all-fast, torch autograd, torch save_on_cpu),
# measuring iteration times and peaks. Each model is first profiled in context on this machine,
# so the predictions (the simulator on this machine's kernel times) and the measurements come
# from the same machine; the profile file is copied to $OUT. --fit: a plan that runs out of memory
# under its cap or makes the allocator retry falls back to the plan solved with 5% more
# headroom (plan_all.sh with HEADROOMS solves them beforehand, so GPU time goes to running them;
# a plan missing there is solved here, which needs a HiGHS wheel carried in .whl).
# Usage: [PLANS=experiments/plans/gpu_fused] bash experiments/gpu/measure_all.sh OUT.csv [MODEL...]
#   (default: every model; PLANS: the kept plans, default experiments/plans/gpu)
set -u
. experiments/gpu/setup.sh
. experiments/gpu/configs.sh
output=$1; shift
models=("$@"); [ ${#models[@]} -gt 0 ] || models=("${MODELS[@]}")
for model in "${models[@]}"; do
  set -- ${CFG[$model]}
  echo "== $model $*"
  python3 -m autotm_py profile "$model" --training --batch "$1" "${@:2}" --device cuda \
      --profiles profiles --no-progress --in-context 2>&1 | grep -E "sums to|error"
  python3 -m autotm_py bench --models "$model" --batch "$1" "${@:2}" --training --device cuda \
      --ratios "$(ratios_of "$model")" --strategies sync,async --solvers highs \
      --time-limit 150 --plans "${PLANS:-experiments/plans/gpu}" --execute --fit --iterations 4 --warmup 1 \
      --no-progress -o "$output" 2>&1 | grep -vE "^(INFO|WARNING)" | tail -3
done
cp profiles/h100-80gb-hbm3.json "${OUT:-/tmp}/"
