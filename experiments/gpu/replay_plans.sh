#!/usr/bin/env bash
# Plans at planned addresses, each replayed as a CUDA graph in a process of its own (`autotm
# run --arena --graph`, medians of 5 timed iterations after 2 warm-ups, as `autotm bench
# --execute` runs them): one line per plan, its run JSON and output in OUT_DIR.
# Usage (GPU machine, repository root):
#   bash experiments/gpu/replay_plans.sh OUT_DIR MODEL BATCH PLAN...
# DIMS (e.g. DIMS=seq=512) binds a symbolic dimension.
set -u
. experiments/gpu/setup.sh
out=$1 model=$2 batch=$3
shift 3
mkdir -p "$out"
for plan in "$@"; do
  name=$(basename "$plan" .json.gz | tr "+" "_")  # the device tool returns no name with "+"
  echo "== $name $(date -u +%H:%M:%S)"
  python3 -m autotm_py run "$model" --training --batch "$batch" ${DIMS:+--dim "$DIMS"} \
      --plan "$plan" --device cuda --arena --graph --iterations 5 --warmup 2 \
      -o "$out/$name.json" >"$out/$name.txt" 2>&1
  echo "rc=$? $(grep -E 'median|measured|retr' "$out/$name.txt" | head -3 | tr '\n' ' ')"
done
