#!/usr/bin/env bash
# Two versions of autotm_py replaying the same plans on one GPU, interleaved: whether a change of
# the run path left the times where they were (issue 43 item 5: within 2%).
#
# Usage (GPU machine, repository root, the wheels of experiments/gpu/setup.sh carried):
#   bash experiments/gpu/ab_versions.sh OLD.tar.gz OUT ROUNDS MODEL=PLAN [MODEL=PLAN ...]
# OLD.tar.gz: the other version's package (`git archive REV autotm_py | gzip > OLD.tar.gz`);
# each round runs every plan with the old version, then the new one, then the next round in the
# other order (new first), each run in a process of its own as `autotm run` runs a plan:
#   autotm run MODEL --plan PLAN --arena --replay --iterations 10 (the old version: --graph)
# Results: OUT/ab_summary.json (medians and new/old ratios, experiments/gpu/ab_summary.py) and
# OUT/ab_runs.tgz, every run's RunResult (<old|new>_<n>_r<round>.json) and output (.log).
set -u
. experiments/gpu/setup.sh
old_tar=$1 final=$2 rounds=$3
# both versions price with this checkout's profiles (the old package has none beside it)
export AUTOTM_SHIPPED_PROFILES=$PWD/profiles
shift 3
site=${PYTHONPATH#"$PWD:"}
out=/tmp/ab_runs
mkdir -p /tmp/autotm_old "$out" "$final"
tar xzf "$old_tar" -C /tmp/autotm_old
run_one() {  # version, index, round, model, plan
  local root=$PWD flag=--replay
  [ "$1" = old ] && root=/tmp/autotm_old flag=--graph
  PYTHONPATH="$root:$site" python3 -m autotm_py run "$4" --plan "$5" --arena "$flag" \
      --iterations 10 -o "$out/$1_$2_r$3.json" > "$out/$1_$2_r$3.log" 2>&1 \
      || echo "failed: $1 $4 $5 (see $1_$2_r$3.log)"
}
for round in $(seq 1 "$rounds"); do
  order="old new"
  [ $((round % 2)) -eq 0 ] && order="new old"
  n=0
  for cell in "$@"; do
    n=$((n + 1))
    for version in $order; do
      echo "== round $round $version $cell $(date -u +%H:%M:%S)"
      run_one "$version" "$n" "$round" "${cell%%=*}" "${cell#*=}"
    done
  done
  # after every round, so that a call cut short still brings back the rounds it finished
  python3 experiments/gpu/ab_summary.py "$out" "$@"
  cp "$out/ab_summary.json" "$final/" && tar czf "$final/ab_runs.tgz" -C /tmp ab_runs
done
