#!/usr/bin/env bash
# The corpus LSTM classifier below its peak (issue 45 item 4): its LSTMGrad kernels' recomputed
# tape is most of its peak, so no budget below the peak is feasible unsplit. With
# `--split-conv-grads auto` (optimize's default) the planner runs the recurrent kernels over
# batch chunks, as few as the budget allows (docs/planning.md, "Splitting convolution backward
# kernels"). This measures, at shares of the unsplit graph's peak:
#   1. every recurrent kernel in each power-of-two count of chunks, isolated and in context
#      (`autotm profile --in-context --split-conv-grads`), so the plans are priced with their
#      own kernels' times on this GPU;
#   2. the unsplit graph all fast beside torch.autograd of it and PyTorch checkpointing
#      (`autotm bench --ratios 1:0`);
#   3. per share: `autotm optimize` (auto split) and `autotm run` of its plan, in its arena,
#      replayed: predicted against measured, the chunks chosen, the reserved peak.
#
# Usage (GPU machine, repository root): bash experiments/gpu/lstm_chunks.sh OUT_DIR
# Variables: RATIOS ("1:1 2:3 1:2": 50%, 40%, 33%), PRECISION (fp32), PROFILE_S (seconds the
# profile step may take, 300), TIME_LIMIT (solver seconds, 60), ITERATIONS (timed iterations of each run, 20), CORPUS (a folder with the
# export), DEVICE (cuda; cpu with SCALE=small checks the script on a CPU machine).
# Writes OUT_DIR/lstm_bench.{csv,json}, OUT_DIR/plan_<share>.json, OUT_DIR/run_<share>.json
# and OUT_DIR/lstm_chunks.json (one line per share: experiments/gpu/lstm_chunks_summary.py).
set -u
[ "${DEVICE:-cuda}" = cpu ] || . experiments/gpu/setup.sh
out=$1
mkdir -p "$out"
corpus=${CORPUS:-$out/corpus}
model=$corpus/lstm_classifier.onnx
device=${DEVICE:-cuda}
opts="--training --precision ${PRECISION:-fp32}"
arena=$([ "$device" = cpu ] || echo "--arena --replay")  # the GPU mode's runs
if [ ! -f "$model" ]; then
  python3 models/corpus/make_corpus.py --out "$corpus" --scale "${SCALE:-gpu}" \
      --only lstm_classifier || exit 1
fi
if [ "$device" = cuda ]; then
  echo "== profile $(date -u +%H:%M:%S)"
  # cut at PROFILE_S: what was measured stays cached (profile resumes), the rest is priced
  # from the whole kernels (k times their time); the log says how far it got
  timeout "${PROFILE_S:-300}" python3 -m autotm_py profile "$model" $opts --device cuda \
      --in-context --split-conv-grads > "$out/profile.log" 2>&1
  echo "profile exit $? $(date -u +%H:%M:%S)"; tail -c 600 "$out/profile.log"
fi
echo "== all fast, autograd, checkpointing $(date -u +%H:%M:%S)"
python3 -m autotm_py bench --models "$model" --ratios 1:0 --strategies async+recompute \
    --device "$device" $opts $arena --execute --workers 1 --no-progress \
    -o "$out/lstm_bench.csv" 2>&1 | tail -n 4
for ratio in ${RATIOS:-1:1 2:3 1:2}; do
  tag=${ratio/:/-}
  echo "== $ratio $(date -u +%H:%M:%S)"
  python3 -m autotm_py optimize "$model" $opts --device cuda --ratio "$ratio" \
      --time-limit "${TIME_LIMIT:-60}" -o "$out/plan_$tag.json" 2>&1 \
      | grep -E "^(budget|result|predicted|note +split)" | cut -c1-240
  [ -f "$out/plan_$tag.json" ] || continue
  python3 -m autotm_py run --plan "$out/plan_$tag.json" --device "$device" \
      --iterations "${ITERATIONS:-20}" -o "$out/run_$tag.json" 2>&1 | grep -E "^(iteration|fast)"
done
python3 experiments/gpu/lstm_chunks_summary.py "$out" -o "$out/lstm_chunks.json"
