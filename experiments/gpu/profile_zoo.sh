#!/usr/bin/env bash
# Profile every zoo training graph at the paper's GPU batch sizes on this CUDA machine into the
# shipped profiles/ (merged with what is there), then copy the profile file to $OUT.
# Usage (device machine): bash experiments/gpu/profile_zoo.sh [SECONDS_BUDGET]
set -u
. experiments/gpu/setup.sh
budget=${1:-420}
start=$(date +%s)
configs=(
  "inception_v4 64" "resnet200 32" "densenet264 32" "vgg19 64"
  "bert_base 16 --dim seq=512" "gpt2_small 8 --dim seq=1024"
  "inception_v4 128" "resnet200 64" "densenet264 64" "vgg19 128"
  "inception_v4 256" "resnet200 128" "densenet264 128" "resnet50 256"
)
for cfg in "${configs[@]}"; do
  set -- $cfg
  left=$(( budget - ($(date +%s) - start) ))
  [ "$left" -gt 10 ] || { echo "budget spent before $cfg"; break; }
  echo "== $cfg (budget left ${left}s)"
  python3 -m autotm_py profile "$1" --training --batch "$2" "${@:3}" --device cuda \
      --profiles profiles --no-progress --max-seconds "$left" 2>&1 | tail -4
done
cp profiles/h100-80gb-hbm3.json "${OUT:-/tmp}/" 2>/dev/null || ls profiles
