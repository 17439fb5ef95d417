#!/usr/bin/env bash
# Channels-last CNNs on the GPU (docs/layout.md), in one call:
#  1. each model's channels-last kernels timed inside whole all-fast iterations (`autotm
#     profile --channels-last --in-context`) into profiles/ (this GPU's file), copied to OUT;
#  2. native_compare.py in both layouts, row-major then channels-last, per model: native eager
#     (torchvision) and our all-fast iteration (eager, under autograd, replayed, replayed at
#     planned addresses), in OUT/nchw_MODEL and OUT/nhwc_MODEL.
# Usage (device machine): bash experiments/gpu/channels_last.sh OUT MODEL:BATCH [MODEL:BATCH...]
set -u
. experiments/gpu/setup.sh
out=$1; shift
mkdir -p "$out"
for spec in "$@"; do
  model=${spec%%:*} batch=${spec#*:}
  echo "== profile $model b$batch channels-last $(date -u +%T)"
  timeout 240 python3 -m autotm_py -v profile "$model" --training --batch "$batch" \
      --channels-last --device cuda --profiles profiles --no-progress --in-context 2>&1 \
      | grep -E "in context|kernels|iteration|rror" | tail -4
done
cp profiles/*.json "$out/"
for spec in "$@"; do
  model=${spec%%:*}
  for layout in nchw nhwc; do
    flag=(); [ "$layout" = nhwc ] && flag=(--channels-last)
    echo "== native_compare $model $layout $(date -u +%T)"
    timeout 240 python3 experiments/gpu/native_compare.py "$out/${layout}_$model" \
        --models "$model" --shares "" --no-ops --no-native-checkpoint --iterations 10 \
        "${flag[@]}" 2>&1 | tail -2 | cut -c1-900
  done
done
