#!/usr/bin/env bash
# Re-time the benchmark configurations' kernels inside whole all-fast iterations (see
# docs/profiling.md, "In-context profiling") into the shipped profiles/, then copy the file
# to $OUT. Usage (device machine): bash experiments/gpu/profile_in_context.sh
set -u
. experiments/gpu/setup.sh
for cfg in "inception_v4 64" "resnet200 32" "densenet264 32" "vgg19 64" \
           "bert_base 16 --dim seq=512" "gpt2_small 8 --dim seq=1024"; do
  set -- $cfg
  echo "== $cfg"
  python3 -m autotm_py -v profile "$1" --training --batch "$2" "${@:3}" --device cuda \
      --profiles profiles --no-progress --in-context 2>&1 | grep -E "in context|kernels|iteration|error" | tail -4
done
cp profiles/h100-80gb-hbm3.json "${OUT:-/tmp}/"
