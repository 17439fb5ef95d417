#!/usr/bin/env bash
# The exported corpus on the GPU (issue 45 item 4): every model of models/corpus/make_corpus.py
# exported at GPU-benchmark sizes (`--scale gpu`: batch 8-128, realistic widths, weights left
# out, so the executor runs seeded random values), then per model `autotm bench --execute`
# with joint plans for an arena replayed from a CUDA graph (`--arena --replay`, each plan in a
# process of its own, as experiments/gpu/bench_arena.sh runs the zoo) at half and a quarter
# of the peak (RATIOS 1:1,1:3), beside what the bench measures in the same run: our all-fast
# iteration, torch.autograd of the same graph with and without save_on_cpu, PyTorch
# activation checkpointing under the same cap, and the first-touch, LRU and offload baselines.
#
# Usage (GPU machine, repository root):
#   bash experiments/gpu/corpus_bench.sh OUT_DIR [MODEL ...]     # default: the whole corpus
# Writes OUT_DIR/corpus/*.onnx (the exports; kept, so a rerun skips them), OUT_DIR/plans/,
# OUT_DIR/corpus_bench.{csv,json} (one row per plan, written row by row: a run cut short keeps
# its rows and a rerun resumes), OUT_DIR/corpus_summary.{csv,json} (one compact line per row:
# predicted vs measured, all-fast, native eager and checkpointing) and
# OUT_DIR/corpus_errors.txt (experiments/gpu/prediction_errors.py over the rows).
#
# Each model's kernels are first measured on this GPU (`autotm profile --in-context`, cached;
# NO_PROFILE=1 skips it), so the predictions are priced with this GPU's own times.
# Variables: RATIOS (default 1:1,1:3), STRATEGIES (async+recompute), TIME_LIMIT (solver
# seconds per plan, 120), SCALE (gpu; small runs the committed CPU sizes), CORPUS (a folder
# that already holds the exports), PLANS (OUT_DIR/plans), EXTRA (more bench options).
# PRECISION (fp32 or bf16; default: the tools' own, bf16 on a GPU that has it): the kernels
# profiled and planned in it (the committed corpus rows before 2026-12-06 are fp32).
# SPLIT=1: every fused convolution backward kernel split into its filter and data parts
# (`bench --split-conv-grads`, rows named +split), the parts measured in context too.
# SOLVE=1 (on the CPU machine, in this checkout's environment): only solve the plans into
# PLANS, rows without measurements; carry PLANS and the exports to the GPU machine with the
# same variables and the GPU run only executes them.
set -u
[ -n "${SOLVE:-}" ] || . experiments/gpu/setup.sh  # SOLVE: this machine's environment
split=$([ -z "${SPLIT:-}" ] || echo --split-conv-grads)
precision=$([ -z "${PRECISION:-}" ] || echo "--precision $PRECISION")
out=$1
shift
mkdir -p "$out"
corpus=${CORPUS:-$out/corpus}
plans=${PLANS:-$out/plans}
if [ $# -eq 0 ]; then
  set -- $(python3 -c 'import sys; sys.path.insert(0, "models/corpus"); import make_corpus
print(" ".join(s.name for s in make_corpus.SPECS))')
fi
missing=()
for model in "$@"; do
  [ -f "$corpus/$model.onnx" ] || missing+=("$model")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== export ${missing[*]} (--scale ${SCALE:-gpu}) $(date -u +%H:%M:%S)"
  only=$(IFS=,; echo "${missing[*]}")
  python3 models/corpus/make_corpus.py --out "$corpus" --scale "${SCALE:-gpu}" --only "$only" \
      || exit 1
fi
for model in "$@"; do
  if [ -z "${SOLVE:-}" ] && [ -z "${NO_PROFILE:-}" ]; then
    # this GPU's own kernel times (cached: a rerun measures nothing again), isolated and then
    # inside whole all-fast iterations, so that the predictions compared are not roofline
    # estimates of kernels no shipped profile has
    echo "== profile $model $(date -u +%H:%M:%S)"
    python3 -m autotm_py profile "$corpus/$model.onnx" --training --device cuda --in-context \
        $split $precision --no-progress 2>&1 | tail -n 2
  fi
  echo "== $model ${RATIOS:-1:1,1:3} $(date -u +%H:%M:%S)"
  python3 -m autotm_py bench --models "$corpus/$model.onnx" --ratios "${RATIOS:-1:1,1:3}" \
      --strategies "${STRATEGIES:-async+recompute}" --device cuda --training \
      --time-limit "${TIME_LIMIT:-120}" --arena --replay $split $precision ${EXTRA:-} \
      $([ -n "${SOLVE:-}" ] || echo --execute) \
      --plans "$plans" --workers 1 --no-progress -o "$out/corpus_bench.csv" 2>&1 | tail -n 8
done
python3 experiments/gpu/corpus_summary.py "$out/corpus_bench.json" -o "$out/corpus_summary.csv"
if [ -z "${SOLVE:-}" ]; then
  python3 experiments/gpu/prediction_errors.py "$out/corpus_bench.json" \
      > "$out/corpus_errors.txt" 2>&1 && tail -n 3 "$out/corpus_errors.txt"
fi
