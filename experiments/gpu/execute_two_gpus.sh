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
#   REPEAT=N runs the pair of passes N times in turn (one, two, one, two, ...: files one_1,
#   two_1, one_2, ...) and compares each pass with the first of its kind as well, so run-to-run
#   noise (one_2 against one_1) stands beside the two-GPU effect (two_k against one_k).
set -u
. experiments/gpu/setup.sh
. experiments/gpu/configs.sh
out=$1; model=${2:-resnet200}
mkdir -p "$out"
set -- ${CFG[$model]}
batch=$1; shift
summary=$out/summary.txt
echo "# $(date -u +%FT%TZ) $model: $(nvidia-smi -L 2>/dev/null | tr '\n' ';')" | tee -a "$summary"
repeat=${REPEAT:-1}
for pass in $(seq 1 "$repeat"); do
for mode in one two; do
  name=$mode; [ "$repeat" -gt 1 ] && name=${mode}_$pass
  rm -f "$out/$name.csv" "$out/$name.json"
  if [ $mode = one ]; then gpus=0; args="--workers 1"; else gpus=0,1; args=${ENGINE_ARGS:-"--workers 2"}; fi
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpus python3 -m autotm_py bench --models "$model" --batch "$batch" "$@" \
      --training --device cuda --ratios "$(ratios_of "$model")" --strategies sync,async \
      --solvers highs --time-limit 150 --plans "${PLANS:-experiments/plans/gpu}" --execute \
      ${FIT---fit} --headroom "${HEADROOM:-0}" \
      --iterations 4 --warmup 1 --no-progress $args -o "$out/$name.csv" >"$out/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf '%-6s GPU(s) %8.1f s  exit %s\n' "$name" "$(python3 -c "print($end - $start)")" "$rc" \
      | tee -a "$summary"
done
done
if [ "$repeat" -eq 1 ]; then
  python3 experiments/gpu/same_rows.py "$out/one.json" "$out/two.json" --measured | tee -a "$summary"
  exit 0
fi
for pass in $(seq 1 "$repeat"); do  # the two-GPU effect, pass by pass
  python3 experiments/gpu/same_rows.py "$out/one_$pass.json" "$out/two_$pass.json" --measured \
      | tee -a "$summary"
done
for pass in $(seq 2 "$repeat"); do  # run-to-run noise of each kind of pass
  for mode in one two; do
    python3 experiments/gpu/same_rows.py "$out/${mode}_1.json" "$out/${mode}_$pass.json" \
        --measured | tee -a "$summary"
  done
done
