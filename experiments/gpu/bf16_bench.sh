#!/usr/bin/env bash
# Issue 46 item 5, one model per call: bf16 training through autotm_py.Trainer
# (`precision="bf16"`, its default GPU mode: an arena at planned addresses, the placed allocator,
# CUDA-graph replay) all fast and at 50/33/25% of the model's bf16 peak, beside native
# torch.autocast(bf16) training of the same module: eager uncapped, activation checkpointing and
# torch.compile with torch._functorch.config.activation_memory_budget under the same caps (the
# budget + 64 MiB). experiments/gpu/trainer_bench.py does the measuring; this runs its processes
# side by side on one GPU:
#   - ours_1: all fast; writes the three budgets (budgets.json) as soon as its graph exists, then
#     profiles the bf16 kernels into the profile cache (the GPU held: gpu.lock), its own and
#     those of the capped processes' chunked-loss graph (--profile-chunks), and touches
#     `profiled`; its placed allocator's region is ALL_FAST_REGION bytes (default 48 GiB, at
#     most 30% of the GPU's memory);
#   - ours_0.5, ours_0.333, ours_0.25: start once the budgets exist, each planned under its
#     budget in bytes from budgets.json (the natives' caps: before 2026-12-03's fix they took
#     their share of their own chunked graph's peak, half the bytes) with the placed
#     allocator's region that budget (what does not fit is reported as overflow); they capture
#     while ours_1 profiles, solve (LIMIT s each) side by side once it has, and time their steps
#     one at a time (gpu.lock);
#   - native: torch.compile at the first of COMPILE compiled (its uncapped first step, without
#     the lock: CPU work but for one step) while the others plan, then eager autocast steps
#     uncapped, the compiled module under each cap (from budgets.json),
#     then checkpointing under each cap (ResNet-200: checkpoint_sequential at the fewest
#     segments that fit; BERT: HF gradient checkpointing; GPT-2: every block), then any further
#     COMPILE fractions. Its process uses torch's caching allocator, so caps work there.
# Nothing is timed while another process times or profiles (gpu.lock), nor before all the
# processes are ready to time (--ready-dir, --parties: five with three shares; their captures,
# profiling, solves and compiles done, or the process ended), so no step is timed beside
# another's host work; captures, solves and compiles overlap. The batches are in pinned memory
# on every side (as DataLoader(pin_memory=True) gives them); the natives' eager steps copy them
# with non_blocking=True. Each process is stopped after PROC_S seconds (default 540), so a call
# ends within the 10 minutes a device command may run.
#
# Usage (GPU machine, repository root, the wheels of setup.sh carried):
#   bash experiments/gpu/bf16_bench.sh OUT_DIR resnet200|bert|gpt2
# Models (bf16, SGD momentum 0.9, lr 0.01, STEPS steps (default 20) timed to their loss, medians
# of the steps after the first three; the natives' medians of 10 steps after 2):
#   resnet200  torchvision ResNet-200 b64 224x224, channels-last   expected ~7-8 min of GPU time
#   bert       HF BertForMaskedLM (BertConfig(), SDPA) b32 s512    expected ~7-8 min
#   gpt2       in-code GPT-2 small b16 s1024, tied head            expected ~6-7 min
#   resnet50   torchvision ResNet-50 b64 224x224, channels-last
# PRECISION=fp32 runs the same processes in fp32 (issue 44 item 6: the Trainer's fp32 plans
# beside native eager, checkpointing and torch.compile, one process each, profiled first);
# BATCH overrides the model's batch (issue 44's GPT-2 is b8).
# BERT and GPT-2 train with the output layer and its loss in 16 blocks of tokens (LOSS_CHUNKS,
# `Trainer(loss_chunks=16)`: without it the bf16 logits' loss kernel alone needs 63% of GPT-2's
# peak, so 50/33/25% have no plan) under the caps, and all fast as the Trainer's default
# chooses (16 blocks on a GPU in bf16, since 2026-12-07; the plain loss in fp32, since
# 2026-12-08); the budgets are shares of the peak of the plain loss's graph (the model as
# users run it); the natives compute the logits whole.
# (expected from the fp32 calls of 2026-12-02, not measured yet: capture 20-60 s, the bf16
# kernels' profiling 1-2 min, solves at LIMIT, torch.compile 1-3 min.)
# Writes OUT_DIR/MODEL/{ours_*.json,native.json,*.log,budgets.json} and, at the end,
# OUT_DIR/MODEL/rows.json and a table (experiments/gpu/bf16_summary.py).
# Variables: STEPS (20), LIMIT (the solver's seconds: 60, ResNet-200 180, whose 33% and 25%
# plans stopped at 60 s, the 25% one 7.2% from its bound, H200 2026-12-04), COMPILE (0.1:
# activation_memory_budget fractions, each a compile; COMPILE= empty: none, for a rerun whose
# compile rows an earlier run of the same code measured), LOSS_CHUNKS (16 for BERT and GPT-2, 1
# for ResNet-200), ALL_FAST_REGION (bytes; 48 GiB, at most 30% of the GPU's memory), PROC_S
# (540), PROFILE_FIRST (1: the kernels profiled by a
# process of their own before the others start, out of the way of their captures; 0: by ours_1;
# PROFILE_ONLY=1: that stage alone), EXTRA (more trainer_bench options; the copies
# priced where they run, docs/planning.md: EXTRA="--plan-option read_pricing=spread
# --plan-option write_pricing=spread --plan-option async_window=60"), SHARES (the capped
# budgets, "0.5 0.333 0.25"; SHARES=0.25 with and without EXTRA in two calls is the spread
# pricing's check at 25%, each call with its own all fast and natives), ALT (more trainer_bench
# options for a second run of each capped share, ours_<share>_alt.json, side by side with the
# first: ALT="--plan-option read_pricing=spread ..." is the spread pricing's check in one call,
# both plans beside one all fast and one set of natives). SMOKE=1: on
# this machine's CPU at toy sizes (--small --device cpu, no setup.sh), a check of the script.
set -u
[ -n "${SMOKE:-}" ] || . experiments/gpu/setup.sh
model=$2
out=$1/$model
mkdir -p "$out"
rm -rf "$out/budgets.json" "$out/profiled" "$out/gpu.lock" "$out/ready" "$out/ready_first" \
       "$out/profiled_first" "$out/gpu_first.lock"
case $model in
  resnet200) cfg=(--model resnet200 --batch 64); small=(--batch 2 --image 64); chunks=1
             limit=180 ;;
  bert) cfg=(--model bert --batch 32 --seq 512); small=(--batch 2 --seq 32); chunks=16; limit=60 ;;
  gpt2) cfg=(--model gpt2 --batch 16 --seq 1024); small=(--batch 2 --seq 32); chunks=16; limit=60 ;;
  resnet50) cfg=(--model resnet50 --batch 64); small=(--batch 2 --image 64); chunks=1; limit=75 ;;
  *) echo "model: resnet200, bert, gpt2 or resnet50" >&2; exit 2 ;;
esac
precision=${PRECISION:-bf16}
# the all-fast processes' placed region: 48 GiB left GPT-2's natives and its 25% process out of
# memory on an 80 GB H100 (2026-12-07), so at most 30% of the card (H100 23.8 GiB, H200 42 GiB;
# GPT-2 b16's all fast holds 7 GiB, ResNet-200 b64's 8.2)
region_1=${ALL_FAST_REGION:-51539607552}
if [ -z "${ALL_FAST_REGION:-}" ] && [ -z "${SMOKE:-}" ]; then
  total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  share=$(( ${total_mib:-0} * 1048576 * 3 / 10 ))
  [ "$share" -eq 0 ] || [ "$share" -ge "$region_1" ] || region_1=$share
fi
[ -z "${SMOKE:-}" ] || cfg+=("${small[@]}" --small --device cpu)
[ -z "${BATCH:-}" ] || cfg+=(--batch "$BATCH")  # the last --batch counts
read -r -a shares <<< "${SHARES:-0.5 0.333 0.25}"
tags=("")  # the capped runs of a share: ours_<share>.json, and ours_<share>_alt.json with ALT
[ -z "${ALT:-}" ] || tags+=(_alt)
bench=(timeout "${PROC_S:-540}" python3 experiments/gpu/trainer_bench.py "${cfg[@]}"
       --precision "$precision" --steps "${STEPS:-20}" --time-limit "${LIMIT:-$limit}"
       --loss-chunks "${LOSS_CHUNKS:-$chunks}" --lock "$out/gpu.lock" --wait-s 480
       --ready-dir "$out/ready" --parties $(( 2 + ${#shares[@]} * ${#tags[@]} )) ${EXTRA:-})
echo "== $model $precision $(date -u +%H:%M:%S)"
if [ "${PROFILE_FIRST:-1}" = 1 ]; then
  # the kernels profiled alone first, in a process of their own (four steps all fast, not
  # counted), so the bench's processes find every profile cached: in the twenty-fourth
  # session's first calls on fresh H100s the process that had profiled beside the others'
  # captures timed its all fast 19% slow, and one such profile priced every kernel 11% high
  "${bench[@]}" "$out/profile_first.json" --shares 1 --loss-chunks auto --no-eager --steps 4 \
      --profile-chunks "${LOSS_CHUNKS:-$chunks}" --signal "$out/profiled_first" \
      --ready-dir "$out/ready_first" --parties 1 --lock "$out/gpu_first.lock" \
      --region "$region_1" >"$out/profile_first.log" 2>&1 \
    || echo "profiling first failed (see $out/profile_first.log); the bench profiles itself"
  echo "profiled first $(date -u +%H:%M:%S)"
  # PROFILE_ONLY=1: this call only profiles (a ResNet-200 call with its profiling may not end
  # within a device command's 10 minutes; the next call on the warm machine finds the cache)
  [ -z "${PROFILE_ONLY:-}" ] || exit 0
fi
# all fast: the Trainer's default loss (loss_chunks="auto": 16 blocks for BERT and GPT-2 on a
# GPU, whose plain loss ran 1.4x slower all fast, H200 2026-12-04; the plain loss for the
# ResNets); the budgets are shares of the peak of the model as users run it, its loss plain
"${bench[@]}" "$out/ours_1.json" --shares 1 --loss-chunks auto --no-eager \
    --budgets-out "$out/budgets.json" --profile-chunks "${LOSS_CHUNKS:-$chunks}" \
    --budget-shares "$(IFS=,; echo "${shares[*]}")" --signal "$out/profiled" \
    --region "$region_1" >"$out/ours_1.log" 2>&1 &
first=$!
# the planning of the others waits for the profiles: if ours_1 ends without them, they go on
(wait_first() { while kill -0 "$first" 2>/dev/null; do sleep 1; done; touch "$out/profiled"; }
 wait_first) &
"${bench[@]}" "$out/native.json" --native --budgets "$out/budgets.json" \
    --compile "${COMPILE-0.1}" >"$out/native.log" 2>&1 &
native=$!
while [ ! -s "$out/budgets.json" ] && kill -0 "$first" 2>/dev/null; do sleep 1; done
pids=()
if [ -s "$out/budgets.json" ]; then
  echo "budgets $(tr -d ' \n' <"$out/budgets.json") $(date -u +%H:%M:%S)"
  for s in "${shares[@]}"; do
    region=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['budgets'][sys.argv[2]])" \
             "$out/budgets.json" "$s")
    for tag in "${tags[@]}"; do
      options=()
      [ -z "$tag" ] || read -r -a options <<< "$ALT"
      "${bench[@]}" "$out/ours_$s$tag.json" --shares "$s" --no-eager --after "$out/profiled" \
          --budgets "$out/budgets.json" --region "$region" "${options[@]}" \
          >"$out/ours_$s$tag.log" 2>&1 &
      pids+=($!)
    done
  done
else
  echo "ours_1 ended before its graph had budgets: no capped runs (see $out/ours_1.log)"
  kill "$native" 2>/dev/null
fi
rc=0
for pid in "$first" "${pids[@]}" "$native"; do wait "$pid" || rc=$?; done
echo "== done $(date -u +%H:%M:%S) (last failing exit status: $rc)"
for log in "$out"/*.log; do echo "-- $log"; grep -v '^W[0-9]' "$log" | tail -n 4; done
python3 experiments/gpu/bf16_summary.py "$out"
