# Sourced by the scripts that run plans one process each (eager_vs_replay.sh,
# connections_ab.sh): one run of a MODEL:BATCH:PLAN[:DIMS] spec, and the name of its plan.
# (Sourced, not run: it defines functions only.)

# The plan file's stem, with "+" spelled "_": the device tool returns no file named with "+".
plan_name() { basename "$1" .json.gz | tr "+" "_"; }

# run_spec FILE LABEL MODEL:BATCH:PLAN[:DIMS] [autotm run options...]: `autotm run` of the plan
# (training, 7 timed iterations) into FILE.json and its output into FILE.txt; prints one line:
# LABEL, the exit status and the run's median and measured lines.
run_spec() {
  local file=$1 label=$2 spec=$3 model batch plan dims
  shift 3
  IFS=: read -r model batch plan dims <<<"$spec"
  python3 -m autotm_py run "$model" --training --batch "$batch" ${dims:+--dim "$dims"} \
      --plan "$plan" --device cuda --iterations 7 "$@" -o "$file.json" >"$file.txt" 2>&1
  echo "$label rc=$? $(grep -E 'median|measured' "$file.txt" | head -2 | tr '\n' ' ')"
}
