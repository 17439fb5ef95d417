#!/usr/bin/env bash
# Re-time the benchmark configurations' kernels (configs.sh) inside whole all-fast iterations
# (docs/profiling.md, "In context") into the shipped profiles/, then copy the file to $OUT.
# Usage (device machine): bash experiments/gpu/profile_in_context.sh [MODEL...]
set -u
. experiments/gpu/setup.sh
. experiments/gpu/configs.sh
models=("$@"); [ ${#models[@]} -gt 0 ] || models=("${MODELS[@]}")
for model in "${models[@]}"; do
  set -- ${CFG[$model]}
  echo "== $model $*"
  python3 -m autotm_py -v profile "$model" --training --batch "$1" "${@:2}" --device cuda \
      --profiles profiles --no-progress --in-context 2>&1 \
      | grep -E "in context|kernels|iteration|error" | tail -4
done
cp profiles/h100-80gb-hbm3.json "${OUT:-/tmp}/"
