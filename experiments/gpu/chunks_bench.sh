#!/usr/bin/env bash
# Corpus models below the floor of their whole kernels, in chunks (issue 45 item 4): the LSTM
# classifier, whose LSTMGrad kernels' recomputed tape is most of its peak (its layers chunk
# their sequence), and the U-Net, whose top-level convolution needs half its peak with cuDNN's
# measured workspace (its convolutions chunk their batch). With `--split-conv-grads auto`
# (optimize's default) the planner runs those kernels over chunks, as few as the budget allows
# (docs/planning.md, sections 7c and 7d). This measures,
# at shares of the unsplit graph's peak:
#   1. every splittable kernel split and chunked in each power-of-two count of chunks,
#      isolated and in context (`autotm profile --in-context --split-conv-grads`, cut at
#      PROFILE_S; IN_CONTEXT=0 measures them isolated only, which the LSTM's variants need to
#      end within a call), so the plans are priced with their own kernels' times on this GPU;
#      the profile cache is copied to OUT_DIR/profiles (to plan with it elsewhere);
#   2. the unsplit graph all fast beside torch.autograd of it and PyTorch checkpointing
#      (`autotm bench --ratios 1:0`);
#   3. per share: `autotm optimize` (auto split) and `autotm run` of its plan, in its arena,
#      replayed: predicted against measured, the chunks chosen, the reserved peak.
#
# Usage (GPU machine, repository root): bash experiments/gpu/chunks_bench.sh OUT_DIR
# Variables: MODEL (lstm_classifier, or unet_small), RATIOS ("1:1 2:3 1:2": 50%, 40%, 33%),
# PRECISION (fp32), PROFILE_S (seconds the profile step may take, 300), TIME_LIMIT (solver
# seconds, 60), ITERATIONS (timed iterations of each run, 20), CORPUS (a folder with the
# export), DEVICE (cuda; cpu with SCALE=small checks the script on a CPU machine).
# Writes OUT_DIR/bench.{csv,json}, OUT_DIR/plan_<share>.json, OUT_DIR/run_<share>.json
# and OUT_DIR/chunks.json (one line per share: experiments/gpu/chunks_summary.py); each
# run's whole output in OUT_DIR/run_<share>.log.
set -u
[ "${DEVICE:-cuda}" = cpu ] || . experiments/gpu/setup.sh
out=$1
mkdir -p "$out"
corpus=${CORPUS:-$out/corpus}
name=${MODEL:-lstm_classifier}
model=$corpus/$name.onnx
device=${DEVICE:-cuda}
opts="--training --precision ${PRECISION:-fp32}"
arena=$([ "$device" = cpu ] || echo "--arena --replay")  # the GPU mode's runs
if [ ! -f "$model" ]; then
  python3 models/corpus/make_corpus.py --out "$corpus" --scale "${SCALE:-gpu}" \
      --only "$name" || exit 1
fi
if [ "$device" = cuda ]; then
  echo "== profile $(date -u +%H:%M:%S)"
  # cut at PROFILE_S: what was measured stays cached (profile resumes), the rest is priced
  # from the whole kernels (k times their time); the log says how far it got
  context=$([ "${IN_CONTEXT:-1}" = 0 ] || echo "--in-context")
  timeout "${PROFILE_S:-300}" python3 -m autotm_py profile "$model" $opts --device cuda \
      $context --split-conv-grads > "$out/profile.log" 2>&1
  echo "profile exit $? $(date -u +%H:%M:%S)"; tail -c 600 "$out/profile.log"
  mkdir -p "$out/profiles" && cp "${AUTOTM_PROFILES:-${XDG_CACHE_HOME:-$HOME/.cache}/autotm/profiles}"/*.json \
      "$out/profiles/"
fi
echo "== all fast, autograd, checkpointing $(date -u +%H:%M:%S)"
python3 -m autotm_py bench --models "$model" --ratios 1:0 --strategies async+recompute \
    --device "$device" $opts $arena --execute --workers 1 --no-progress \
    -o "$out/bench.csv" 2>&1 | tail -n 4
for ratio in ${RATIOS:-1:1 2:3 1:2}; do
  tag=${ratio/:/-}
  echo "== $ratio $(date -u +%H:%M:%S)"
  python3 -m autotm_py optimize "$model" $opts --device cuda --ratio "$ratio" \
      --time-limit "${TIME_LIMIT:-60}" -o "$out/plan_$tag.json" 2>&1 \
      | grep -E "^(budget|result|predicted|note +split)" | cut -c1-240
  [ -f "$out/plan_$tag.json" ] || continue
  python3 -m autotm_py run --plan "$out/plan_$tag.json" --device "$device" \
      --iterations "${ITERATIONS:-20}" -o "$out/run_$tag.json" > "$out/run_$tag.log" 2>&1
  grep -E "^(iteration|fast|error)" "$out/run_$tag.log" || tail -n 5 "$out/run_$tag.log"
done
python3 experiments/gpu/chunks_summary.py "$out" -o "$out/chunks.json"
