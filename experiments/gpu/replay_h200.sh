#!/usr/bin/env bash
# Replay (`replay_plans.sh`: `autotm run --arena --graph`, one process per plan) the plans of
# the H200 benchmark priced with the H200's own profiles (`experiments/gpu/plan_h200.sh`, rows
# `...+gpu-h200`) that a full `bench_arena.sh` sweep does not cover in one call: the chunked
# BERT-base and GPT-2 small (joint and recompute-only, 50/33/25%), the plain transformers' joint
# plans, the holdouts ResNet-50 b32 and the Transformer b64, and VGG19 at 86/90%.
# Usage (GPU machine): bash experiments/gpu/replay_h200.sh OUT_DIR
set -u
out=$1
B=experiments/plans/bench_arena
W=highs_arena+graph+placed+windows
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
DIMS=seq=512 bash experiments/gpu/replay_plans.sh "$out" bert_base 16 \
    $(plans bert_base_16_seq-512_True_cuda_h100-pcie5 +loss16+gpu-h200 1-1 1-2 1-3) \
    $(plans bert_base_16_seq-512_True_cuda_h100-pcie5 +gpu-h200 1-1 1-2)
DIMS=seq=1024 bash experiments/gpu/replay_plans.sh "$out" gpt2_small 8 \
    $(plans gpt2_small_8_seq-1024_True_cuda_h100-pcie5 +loss16+gpu-h200 1-1 1-2 1-3) \
    $(plans gpt2_small_8_seq-1024_True_cuda_h100-pcie5 +gpu-h200 1-1)
bash experiments/gpu/replay_plans.sh "$out" resnet50 32 $(plans resnet50_32_True_cuda_h100-pcie5 +gpu-h200 1-1 1-2 1-3)
bash experiments/gpu/replay_plans.sh "$out" transformer 64 $(plans transformer_64_True_cuda_h100-pcie5 +gpu-h200 1-1 1-2 1-3)
bash experiments/gpu/replay_plans.sh "$out" vgg19 64 $(plans vgg19_64_True_cuda_h100-pcie5 +gpu-h200 6-1 9-1)
