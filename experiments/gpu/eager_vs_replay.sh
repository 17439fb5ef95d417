#!/usr/bin/env bash
# The same plans at planned addresses, run eagerly and replayed as a CUDA graph, in turn on one
# machine (issue 14 item 3: are copy-bound plans better off eager?). Each run is a process of
# its own (the placed allocator is process-wide). Prints one line per run; JSON in OUT_DIR.
# Usage (GPU machine, repository root):
#   bash experiments/gpu/eager_vs_replay.sh OUT_DIR MODEL:BATCH:PLAN[:DIMS] ...
set -u
. experiments/gpu/setup.sh
. experiments/gpu/run_spec.sh
out=$1
shift
mkdir -p "$out"
for spec in "$@"; do
  IFS=: read -r _ _ plan _ <<<"$spec"
  name=$(plan_name "$plan")
  for mode in eager graph; do
    flags=(--arena)
    [ "$mode" = graph ] && flags+=(--graph)
    run_spec "$out/${name}_$mode" "$mode $name" "$spec" "${flags[@]}"
  done
done
