#!/usr/bin/env bash
# Issue 14 item 3 in one call: the `--fit` rows (plans solved for torch's caching allocator at
# headroom 0, 5%, ... 25%, run eagerly; the first headroom that runs without allocator retries
# is kept, AutoTM's defrag loop) beside headroom-0 plans of the same budgets at planned
# addresses, replayed as CUDA graphs (`replay_plans.sh`: `autotm run --arena --graph`, each a
# process of its own).
# The bench sweep also measures the all-fast iteration, native eager and the baselines.
#
# The fit plans should all be in FIT_PLANS (solved beforehand: `PLANS=... HEADROOMS="0.05 0.1
# 0.15 0.2 0.25" ONLY=MODEL bash experiments/gpu/plan_all.sh`), else the GPU machine solves them.
#
# Usage (GPU machine, repository root):
#   bash experiments/gpu/fit_vs_arena.sh OUT_DIR MODEL BATCH RATIOS FIT_PLANS ARENA_PLAN...
#   e.g. ... $OUT/fva inception_v4 64 1:1,1:2 experiments/plans/gpu_fused \
#            experiments/plans/bench_arena/inception_v4_64_..._1-1_async_highs_arena+graph+placed.json.gz
# DIMS (e.g. DIMS=seq=512) binds a symbolic dimension for both; EXTRA adds options to the fit
# rows' bench (EXTRA="--gpu h200": plans priced with the H200's profiles, experiments/gpu/plan_h200.sh).
set -u
. experiments/gpu/setup.sh
out=$1 model=$2 batch=$3 ratios=$4 fit_plans=$5
shift 5
mkdir -p "$out"
echo "== fit rows: $model $ratios $(date -u +%H:%M:%S)"
python3 -m autotm_py bench --models "$model" --batch "$batch" ${DIMS:+--dim "$DIMS"} --training \
    --device cuda --ratios "$ratios" --strategies sync,async --time-limit 150 \
    --plans "$fit_plans" --execute --fit ${EXTRA:-} --no-progress -o "$out/fit.csv" 2>&1 | tail -n 8
bash experiments/gpu/replay_plans.sh "$out" "$model" "$batch" "$@"
