#!/usr/bin/env bash
# On a machine with two GPUs: the executed cells of one model (the plans committed in
# experiments/plans/gpu, as measure_all.sh runs them, with --fit) on one GPU, then on two GPUs
# at once (`--engine local --workers 2`: one worker process per GPU, CUDA_VISIBLE_DEVICES set
# to its GPU; one task per ratio and one for the model's own runs, docs/bench.md); then the wall
# times and the measured times of the two runs compared row by row (same_rows.py --measured).
# Usage: bash experiments/gpu/execute_two_gpus.sh OUTDIR [MODEL]   (default resnet200)
#   ENGINE_ARGS="--engine ray" runs the two-GPU pass on a Ray instance instead (ray wheel needed).
#   PLANS=DIR reads (and writes) the plans there; FIT="" HEADROOM=0.2 runs the plans of that one
#   headroom instead of the --fit loop (solved beforehand: bench ... --headroom 0.2 --plans DIR).
set -u
. experiments/gpu/setup.sh
. experiments/gpu/configs.sh
out=$1; model=${2:-resnet200}
mkdir -p "$out"
set -- ${CFG[$model]}
batch=$1; shift
summary=$out/summary.txt
echo "# $(date -u +%FT%TZ) $model: $(nvidia-smi -L 2>/dev/null | tr '\n' ';')" | tee -a "$summary"
for mode in one two; do
  rm -f "$out/$mode.csv" "$out/$mode.json"
  if [ $mode = one ]; then gpus=0; args="--workers 1"; else gpus=0,1; args=${ENGINE_ARGS:-"--workers 2"}; fi
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpus python3 -m autotm_py bench --models "$model" --batch "$batch" "$@" \
      --training --device cuda --ratios "$(ratios_of "$model")" --strategies sync,async \
      --solvers highs --time-limit 150 --plans "${PLANS:-experiments/plans/gpu}" --execute \
      ${FIT---fit} --headroom "${HEADROOM:-0}" \
      --iterations 4 --warmup 1 --no-progress $args -o "$out/$mode.csv" >"$out/$mode.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf '%-4s GPU(s) %8.1f s  exit %s\n' "$mode" "$(python3 -c "print($end - $start)")" "$rc" \
      | tee -a "$summary"
done
python3 experiments/gpu/same_rows.py "$out/one.json" "$out/two.json" --measured | tee -a "$summary"
