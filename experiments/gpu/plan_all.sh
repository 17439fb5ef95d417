#!/usr/bin/env bash
# Solve every GPU benchmark plan on this (CPU) machine with the shipped H100 profiles, keeping
# the plans in experiments/plans/gpu so that the GPU machine only executes them:
#   bash experiments/gpu/plan_all.sh            (here)
#   bash experiments/gpu/measure_all.sh ...     (on the GPU machine)
# HEADROOMS="0 0.05 0.1" also solves each cell with that share of the budget left free for the
# allocator's fragmentation (the plans `autotm bench --execute --fit` falls back to).
# BENCH_ARGS is added to every `autotm bench` (e.g. "--workers 1" for one cell at a time, or
# "--engine ray --address auto"; the default runs the cells of a model on every CPU here);
# PLANS and OUTPUT move the plans and the results; ONLY="resnet200 bert_base" picks models.
set -eu
. experiments/gpu/configs.sh
OUTPUT=${OUTPUT:-experiments/results/gpu_plans.csv}
PLANS=${PLANS:-experiments/plans/gpu}
AUTOTM=${AUTOTM:-autotm}
for headroom in ${HEADROOMS:-0}; do
  # rows are keyed without the headroom: one CSV per headroom keeps the sweeps apart
  output=$OUTPUT; [ "$headroom" = 0 ] || output=${TMPDIR:-/tmp}/gpu_plans_h$headroom.csv
  for model in ${ONLY:-${MODELS[@]}}; do
    set -- ${CFG[$model]}
    # shellcheck disable=SC2086  # AUTOTM and BENCH_ARGS are word lists
    $AUTOTM bench --models "$model" --batch "$1" "${@:2}" --training --device cuda \
        --ratios "$(ratios_of "$model")" --strategies sync,async --solvers highs \
        --time-limit 150 --headroom "$headroom" --plans "$PLANS" --no-progress \
        ${BENCH_ARGS:-} -o "$output"
  done
done
