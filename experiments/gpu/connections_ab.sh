#!/usr/bin/env bash
# The same plans replayed (`autotm run --arena --graph`) under several values of
# CUDA_DEVICE_MAX_CONNECTIONS (the hardware work queues a CUDA context spreads its streams
# over), in turn on one machine: with 8 (CUDA's default) the copies of a replayed plan ran 9-14%
# slower than eagerly, with 1 at their eager speed (replay_profile.py, docs/gpu.md "Copies in a
# replay: the work queues"). One process per run; prints one line per run; JSON in OUT_DIR.
# Usage (GPU machine, repository root):
#   bash experiments/gpu/connections_ab.sh OUT_DIR "1 8" MODEL:BATCH:PLAN[:DIMS] ...
# ROUNDS=N (default 1) repeats the whole sweep, values in reverse order every other round.
set -u
. experiments/gpu/setup.sh
. experiments/gpu/run_spec.sh
out=$1 values=$2
shift 2
mkdir -p "$out"
for round in $(seq 1 "${ROUNDS:-1}"); do
  order=$values
  [ $((round % 2)) = 0 ] && order=$(echo "$values" | tr ' ' '\n' | tac | tr '\n' ' ')
  for spec in "$@"; do
    IFS=: read -r _ _ plan _ <<<"$spec"
    name=$(plan_name "$plan")
    for v in $order; do
      CUDA_DEVICE_MAX_CONNECTIONS=$v run_spec "$out/${name}_c${v}_r$round" \
          "connections=$v $name round $round" "$spec" --arena --graph
    done
  done
done
