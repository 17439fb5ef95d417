#!/usr/bin/env bash
# Replay (`replay_plans.sh`: `autotm run --arena --graph`, one process per plan) the plans of
# the H200 benchmark priced with the H200's own profiles (`experiments/gpu/plan_h200.sh`, rows
# `...+gpu-h200`) that a full `bench_arena.sh` sweep does not cover in one call: the chunked
# BERT-base and GPT-2 small (joint and recompute-only where one exists, 50/33/25%), the plain
# transformers' joint plans, the holdouts ResNet-50 b32 and the Transformer b64, and VGG19 at
# 86/90%.
# Usage (GPU machine): bash experiments/gpu/replay_h200.sh OUT_DIR [GROUP...]
# GROUP: bert-chunked gpt2-chunked bert gpt2 resnet50 transformer vgg19 (default: all).
# MEM: the memory system in the plans' names: h200-pcie5 (default; plans solved since
# 2026-11-29 cross the H200's own link) or h100-pcie5 (the plans of 2026-11-28, which crossed
# the H100's).
set -u
out=$1
shift
groups=" ${*:-bert-chunked gpt2-chunked bert gpt2 resnet50 transformer vgg19} "
B=experiments/plans/bench_arena
# the plans' options as `autotm bench --plans` names them since 2026-12-01; the plans solved
# before (experiments/plans/bench_arena, 2026-11-28 and 2026-11-29) are named
# highs_arena+graph+placed+windows... and are not found under this name: rename them, or set W
# to that spelling here, to replay them
W=highs_arena+replay+placed+windows
plans() {  # MODEL_KEY SUFFIX RATIO... -> the plan files that exist
  local key=$1 suffix=$2
  shift 2
  for r in "$@"; do
    for s in async+recompute recompute-only; do
      f=$B/${key}_${r}_${s}_${W}${suffix}.json.gz
      [ -f "$f" ] && echo "$f"
    done
  done
}
replay() {  # GROUP MODEL BATCH DIMS KEY SUFFIX RATIO...
  local group=$1 model=$2 batch=$3 dims=$4
  shift 4
  [[ "$groups" == *" $group "* ]] || return 0
  DIMS=$dims bash experiments/gpu/replay_plans.sh "$out" "$model" "$batch" $(plans "$@")
}
MEM=${MEM:-h200-pcie5}
BERT=bert_base_16_seq-512_True_cuda_$MEM GPT2=gpt2_small_8_seq-1024_True_cuda_$MEM
replay bert-chunked bert_base 16 seq=512 $BERT +loss16+gpu-h200 1-1 1-2 1-3
replay gpt2-chunked gpt2_small 8 seq=1024 $GPT2 +loss16+gpu-h200 1-1 1-2 1-3
replay bert bert_base 16 seq=512 $BERT +gpu-h200 1-1 1-2
replay gpt2 gpt2_small 8 seq=1024 $GPT2 +gpu-h200 1-1
replay resnet50 resnet50 32 "" resnet50_32_True_cuda_$MEM +gpu-h200 1-1 1-2 1-3
replay transformer transformer 64 "" transformer_64_True_cuda_$MEM +gpu-h200 1-1 1-2 1-3
replay vgg19 vgg19 64 "" vgg19_64_True_cuda_$MEM +gpu-h200 6-1 9-1
