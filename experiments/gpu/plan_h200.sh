#!/usr/bin/env bash
# Solve, on this CPU machine, the plans of the H200 benchmark priced with the H200's own
# profiles (`--gpu h200`, profiles/h200.json), in the order the GPU calls need them:
#   1. move-only arena plans of the cells where issue 14 item 3's margin over the `--fit` rows
#      was open (Inception-v4 b64 at 50/33%, DenseNet-264 b32 at 33%);
#   2. their `--fit` rows: sync and async plans for torch's caching allocator at headroom 0,
#      5%, ... 25% (experiments/plans/h200; `fit_vs_arena.sh` runs them);
#   3. the joint arena plans of the benchmark cells and the holdouts (experiments/plans/bench_arena).
# STEPS="1 2 3" picks steps. Each `autotm bench` keeps its plans; a rerun skips solved cells.
# (Arena plans are named with the bench options, `..._arena+replay+placed+windows+gpu-h200`
# since 2026-12-01: those solved before, `..._arena+graph+...` in experiments/plans/bench_arena,
# are not found under that name, and a rerun solves their cells again.)
set -u
STEPS=${STEPS:-1 2 3}
H200="--device cuda --gpu h200 --training --time-limit 180 --no-progress --workers 2"
ARENA="--arena --replay --plans experiments/plans/bench_arena"
out=${TMPDIR:-/tmp}/plan_h200
mkdir -p "$out"
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has 1; then
  autotm bench $H200 $ARENA --models inception_v4 --batch 64 --ratios 1:1,1:2 --strategies async -o "$out/fva_inception.csv"
  autotm bench $H200 $ARENA --models densenet264 --batch 32 --ratios 1:2 --strategies async -o "$out/fva_densenet.csv"
fi
if has 2; then
  for h in 0 0.05 0.1 0.15 0.2 0.25; do
    autotm bench $H200 --plans experiments/plans/h200 --headroom $h --models inception_v4 --batch 64 --ratios 1:1,1:2 --strategies sync,async -o "$out/fit_inception_h$h.csv"
    autotm bench $H200 --plans experiments/plans/h200 --headroom $h --models densenet264 --batch 32 --ratios 1:2 --strategies sync,async -o "$out/fit_densenet_h$h.csv"
  done
fi
if has 3; then
  for m in "resnet200 32" "densenet264 32" "inception_v4 64"; do
    set -- $m
    autotm bench $H200 $ARENA --models $1 --batch $2 --ratios 1:1,1:2,1:3 --strategies async+recompute -o "$out/joint_$1.csv"
  done
  for m in "bert_base 16 seq=512" "gpt2_small 8 seq=1024"; do
    set -- $m
    autotm bench $H200 $ARENA --models $1 --batch $2 --dim $3 --loss-chunks 16 --ratios 1:1,1:2,1:3 --strategies async+recompute,recompute-only -o "$out/chunked_$1.csv"
  done
  autotm bench $H200 $ARENA --models bert_base --batch 16 --dim seq=512 --ratios 1:1,1:2 --strategies async+recompute -o "$out/plain_bert.csv"
  autotm bench $H200 $ARENA --models gpt2_small --batch 8 --dim seq=1024 --ratios 1:1 --strategies async+recompute -o "$out/plain_gpt2.csv"
  autotm bench $H200 $ARENA --models resnet50 --batch 32 --ratios 1:1,1:2,1:3 --strategies async+recompute -o "$out/joint_resnet50.csv"
  autotm bench $H200 $ARENA --models transformer --batch 64 --ratios 1:1,1:2,1:3 --strategies async+recompute -o "$out/joint_transformer.csv"
  autotm bench $H200 $ARENA --models vgg19 --batch 64 --ratios 6:1,9:1 --strategies async+recompute -o "$out/joint_vgg19.csv"
fi
