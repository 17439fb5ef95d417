#!/usr/bin/env bash
# The GPU benchmark's planning step (plan_all.sh at headroom 0) timed one cell at a time and
# in parallel, each from empty plan and result folders, then every parallel run's rows checked
# against the serial ones (same_rows.py). docs/bench.md has the numbers.
# Usage: bash experiments/gpu/plan_parallel.sh OUTDIR MODE...
#   MODE: serial            --workers 1 (one cell at a time, in the driver's process)
#         local:N           --engine local --workers N (worker processes here)
#         ray               a Ray head started here for the run (`ray start --head`), then
#                           --engine ray --address auto, then `ray stop` (which stops every
#                           Ray instance of this machine: run it where no other one lives)
# Here (2 cores):       bash experiments/gpu/plan_parallel.sh /tmp/pp serial local:2
# GPU machine (16 CPU): bash experiments/gpu/plan_parallel.sh $OUT/pp serial ray local:16
#   (with experiments/gpu/setup.sh sourced first; ray needs the ray wheel and its
#   dependencies there: `--engine ray` says so in one line when it is missing)
# ONLY="resnet200 bert_base" picks models (configs.sh), AUTOTM the command (default: autotm),
# PYTHON the interpreter for same_rows.py (default: python3).
set -u
# the ray command (a wheel installed with --target has no `ray` on PATH)
RAY=${RAY:-${PYTHON:-python3} -m ray.scripts.scripts}
out=$1; shift
mkdir -p "$out"
summary=$out/summary.txt
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" \
    | tee -a "$summary"
for mode in "$@"; do
  name=${mode/:/}
  rm -rf "$out/plans-$name" "$out/$name.csv" "$out/$name.json"
  case $mode in
    serial) args="--workers 1" ;;
    local:*) args="--engine local --workers ${mode#local:}" ;;
    ray) $RAY start --head --num-cpus "$(nproc)" --include-dashboard false >"$out/ray-start.log" 2>&1 \
           || { echo "ray start failed: $(tail -1 "$out/ray-start.log")" | tee -a "$summary"; continue; }
         args="--engine ray --address auto" ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  start=$(date +%s.%N)
  OUTPUT=$out/$name.csv PLANS=$out/plans-$name BENCH_ARGS=$args \
      bash experiments/gpu/plan_all.sh >"$out/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  [ "$mode" = ray ] && $RAY stop >/dev/null 2>&1
  printf '%-10s %8.1f s  exit %s  %s\n' "$mode" "$(python3 -c "print($end - $start)")" "$rc" \
      "$(grep -c . "$out/$name.csv" 2>/dev/null) lines" | tee -a "$summary"
done
for mode in "$@"; do
  name=${mode/:/}
  [ "$name" = serial ] || [ ! -f "$out/$name.json" ] || [ ! -f "$out/serial.json" ] || \
    ${PYTHON:-python3} experiments/gpu/same_rows.py "$out/serial.json" "$out/$name.json" | tee -a "$summary"
done
