#!/usr/bin/env bash
# The same plans at planned addresses, run eagerly and replayed as a CUDA graph, in turn on one
# machine (issue 14 item 3: are copy-bound plans better off eager?). Each run is a process of
# its own (the placed allocator is process-wide). Prints one line per run; JSON in OUT_DIR.
# Usage (GPU machine, repository root):
#   bash experiments/gpu/eager_vs_replay.sh OUT_DIR MODEL:BATCH:PLAN[:DIMS] ...
set -u
. experiments/gpu/setup.sh
out=$1
shift
mkdir -p "$out"
for spec in "$@"; do
  IFS=: read -r model batch plan dims <<<"$spec"
  name=$(basename "$plan" .json.gz | tr "+" "_")  # the device tool returns no name with "+"
  for mode in eager graph; do
    flags=(--arena)
    [ "$mode" = graph ] && flags+=(--graph)
    python3 -m autotm_py run "$model" --training --batch "$batch" ${dims:+--dim "$dims"} \
        --plan "$plan" --device cuda --iterations 7 "${flags[@]}" \
        -o "$out/${name}_$mode.json" >"$out/${name}_$mode.txt" 2>&1
    echo "$mode $name rc=$? $(grep -E 'median|measured' "$out/${name}_$mode.txt" | head -2 | tr '\n' ' ')"
  done
done
