#!/usr/bin/env bash
# The benchmark of issues 13 item 5 and 14 item 3 with `autotm bench --execute`: joint plans
# made for an arena, the placed allocator and CUDA-graph replay (`--arena --replay`, each plan
# run in a process of its own), beside what the sweep measures in the same run: our all-fast
# iteration replayed, torch.autograd of the same graph (native eager) and with save_on_cpu,
# PyTorch activation checkpointing of the same graph under the same cap (fewest segments that
# fit), and the first-touch, LRU and offload baselines under the cap.
#
# Plans come from experiments/plans/bench_arena (solved on the CPU machine with HiGHS and the
# shipped H100 profiles: `autotm bench` without --execute and the same options, or adopted from
# optimize runs with experiments/bench_adopt_plans.py); a cell without its plan there would be
# solved on the GPU machine, so every cell asked for should have one. Plans are found by the
# name `autotm bench --plans` gives them, whose options part names replay `replay` since
# 2026-12-01 (`..._arena+replay+placed+windows.json.gz`); the plans saved there before are named
# `..._arena+graph+...` and are not found under today's names (their cells would be solved
# again): rename them (`+graph` -> `+replay` in the options part) to run them with this script.
#
# Usage (GPU machine, repository root):
#   bash experiments/gpu/bench_arena.sh OUT_DIR resnet200/1:1,1:2 resnet200/1:3/spread ...
# Each argument is MODEL/RATIOS[/spread] (spread: plans priced with --read-pricing spread, a
# sweep of its own). Rows go to OUT_DIR/bench_arena.{csv,json}, one row at a time (a sweep cut
# short keeps its rows; rerun to resume). STRATEGIES (default async+recompute) picks the plan
# families; EXTRA adds bench options, e.g. EXTRA="--scratch region" for plans with one scratch
# region (their own rows: options arena+replay+placed; the default since 2026-11-28 evening is
# scratch windows, options arena+replay+placed+windows, as EXTRA="--scratch windows" asked before;
# rows before 2026-12-01 say graph for replay: arena+graph+placed+windows).
#
# SOLVE=1, on the CPU machine before the GPU call, with the same arguments and variables: only
# solves the plans that call needs into PLANS (default experiments/plans/bench_arena, which is
# not tracked: experiments/README.md, "Plans"), rows in OUT_DIR/bench_arena.{csv,json} without
# measurements (in the environment of this checkout, e.g. its .venv); carry PLANS to the GPU
# machine.
set -u
[ -n "${SOLVE:-}" ] || . experiments/gpu/setup.sh  # SOLVE: this machine's environment
out=$1
shift
mkdir -p "$out"
declare -A CFG=(
  [resnet200]="32" [bert_base]="16 --dim seq=512" [inception_v4]="64" [densenet264]="32"
  [gpt2_small]="8 --dim seq=1024" [vgg19]="64" [resnet50]="32" [transformer]="64"
)
for cell in "$@"; do
  IFS=/ read -r model ratios pricing <<<"$cell"
  set -- ${CFG[$model]}
  echo "== $model $ratios ${pricing:-step} $(date -u +%H:%M:%S)"
  python3 -m autotm_py bench --models "$model" --ratios "$ratios" \
      --strategies "${STRATEGIES:-async+recompute}" --device cuda --training --batch "$1" \
      "${@:2}" --time-limit 180 --arena --replay --read-pricing "${pricing:-step}" ${EXTRA:-} \
      $([ -n "${SOLVE:-}" ] || echo --execute) \
      --plans "${PLANS:-experiments/plans/bench_arena}" --workers 1 --no-progress \
      -o "$out/bench_arena.csv" 2>&1 | tail -n 8
done
