#!/usr/bin/env bash
# Solve, on this (CPU) machine with the shipped H100 profiles and HiGHS, the plans that
# experiments/gpu/recompute_check.sh runs on the GPU machine (issue 13 item 5): joint
# keep/move/recompute plans (async+recompute) at 50% and 25% of the peak (ratios 1:1, 1:3;
# BERT-base 1:2, below),
# each at the headrooms earlier GPU runs needed for the caching allocator (docs/gpu.md), and a
# move-only async plan beside them for the first models. Plans already there are kept.
#   bash experiments/gpu/plan_recompute.sh                 (every model, in order)
#   ONLY="resnet200 bert_base" TIME_LIMIT=150 bash experiments/gpu/plan_recompute.sh
#   ARENA=1 ONLY=gpt2_small RATIOS="1:1 1:2" bash experiments/gpu/plan_recompute.sh
# ARENA=1: the joint plans at planned addresses, priced for CUDA-graph replay (`--arena
# --graph`, headroom 0: the planner packs the arena into the budget itself), named
# MODEL_RATIO_async+recompute_arena_graph.json.gz; no move-only plans.
# GRAPH=1: the joint plans priced for CUDA-graph replay with static inputs under the cap
# (`--graph`, no arena: torch's caching allocator, so headroom as eager plans), at the headrooms
# in GRAPH_HEADROOMS (default "0.05 0.1"), named MODEL_RATIO_async+recompute_graph_hH.json.gz;
# no move-only plans.
#   GRAPH=1 RATIOS="1:1 1:2 1:3" ONLY=resnet200 bash experiments/gpu/plan_recompute.sh
# EARLY=W (with ARENA=1 or GRAPH=1): `--recompute-early W` (checkpoint-style plans, started
# from a segment plan: docs/planning.md "Early points"), names ending in _eW. Without it the
# CLI's default applies (W = 32, kept only where the segment start pays).
# READ_PRICING=spread (with ARENA=1 or GRAPH=1): `--read-pricing spread` (reads priced over the
# kernels until their use: docs/planning.md "Pricing reads where they join"), names ending in
# _spread (after _eW).
set -eu
PLANS=${PLANS:-experiments/plans/recompute}
AUTOTM=${AUTOTM:-python3 -m autotm_py}
TIME_LIMIT=${TIME_LIMIT:-150}
declare -A CFG=(
  [resnet200]="32" [bert_base]="16 --dim seq=512" [inception_v4]="64" [densenet264]="32"
  [gpt2_small]="8 --dim seq=1024"
)
# the headrooms the move-only plans of these models needed on the H100 (gpu_h100.json), with
# one step more: a recomputing plan allocates and frees more often
declare -A HEADROOMS=(
  [resnet200]="0.05 0.1 0.2" [bert_base]="0.05 0.1 0.15 0.2" [inception_v4]="0.1 0.2"
  [densenet264]="0.2 0.3" [gpt2_small]="0.05 0.2"
)
# budgets: 50% and 25% of the peak (1:1, 1:3); BERT-base's fused graph has no plan at 25%
# (its loss gradient needs the 954 MiB logits, their gradient and the probabilities at once:
# 28% of the peak at headroom 0.05), so it gets 33% (1:2) instead
declare -A RATIOS_OF=([bert_base]="1:1 1:2")
MOVE_ONLY=${MOVE_ONLY:-"resnet200 bert_base"}
mkdir -p "$PLANS"
solve() {  # model ratio headroom recompute name [optimize options]
  local model=$1 ratio=$2 headroom=$3 recompute=$4 name=$5
  local out="$PLANS/${model}_${ratio/:/-}_${name}_h${headroom}.json.gz"
  [ -n "${ARENA:-}" ] && out="$PLANS/${model}_${ratio/:/-}_${name}.json.gz"
  [ -e "$out" ] && return 0
  shift 5
  local extra=("$@")
  set -- ${CFG[$model]}
  # shellcheck disable=SC2086  # AUTOTM is a word list
  $AUTOTM optimize "$model" --training --batch "$1" "${@:2}" --device cuda --ratio "$ratio" \
      --strategy async --recompute "$recompute" --solver highs --time-limit "$TIME_LIMIT" \
      --headroom "$headroom" "${extra[@]}" --no-baselines -o "$out" 2>&1 \
      | grep -E "^(model|budget|predicted|moved|recomputed|fast peak|arena|solver|note|result)" \
      | sed "s|^|$model $ratio h$headroom $name: |"
}
for model in ${ONLY:-resnet200 bert_base inception_v4 densenet264 gpt2_small}; do
  for ratio in ${RATIOS:-${RATIOS_OF[$model]:-1:1 1:3}}; do
    early=() suffix=""
    [ -n "${EARLY:-}" ] && early=(--recompute-early "$EARLY") suffix="_e$EARLY"
    if [ -n "${READ_PRICING:-}" ]; then
      early+=(--read-pricing "$READ_PRICING") suffix="${suffix}_$READ_PRICING"
    fi
    if [ -n "${ARENA:-}" ]; then
      solve "$model" "$ratio" 0 on "async+recompute_arena_graph$suffix" --arena --graph "${early[@]}"
      continue
    fi
    if [ -n "${GRAPH:-}" ]; then
      for headroom in ${GRAPH_HEADROOMS:-0.05 0.1}; do
        solve "$model" "$ratio" "$headroom" on "async+recompute_graph$suffix" --graph "${early[@]}"
      done
      continue
    fi
    for headroom in ${HEADROOMS[$model]}; do
      solve "$model" "$ratio" "$headroom" on async+recompute
    done
    case " $MOVE_ONLY " in
      *" $model "*) solve "$model" "$ratio" "${MOVE_HEADROOM:-0.1}" off async ;;
    esac
  done
done
