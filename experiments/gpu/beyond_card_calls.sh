#!/usr/bin/env bash
# Issue 49's GPU calls, each one device command of at most ten minutes, every part a process of
# its own with a timeout (experiments/gpu/beyond_card.py), logs and JSON under OUT. The profile
# and plan caches go from call to call as OUT/caches.tgz: copy the last call's back into the
# repository root (untracked) before the next, which unpacks it when present.
#
#   bash experiments/gpu/beyond_card_calls.sh split OUT   # uncapped b4, b8; 3.33B b16 split, share 0.7
#   bash experiments/gpu/beyond_card_calls.sh host OUT    # uncapped b4; 3.33B b16 host; FSDP2 b8
#   bash experiments/gpu/beyond_card_calls.sh auto OUT    # uncapped b4; 3.33B b16 split, the planner's cut
#   bash experiments/gpu/beyond_card_calls.sh seven OUT   # the 6.66B decoder at 24 GiB, batch 4
#   bash experiments/gpu/beyond_card_calls.sh eighty OUT  # split GPU test; the 6.66B decoder at 80 GiB
#                                                         # (the whole card less 3 GiB where smaller)
#   SIZE=8b bash experiments/gpu/beyond_card_calls.sh card OUT  # eighty's decoder run alone, sized
#   bash experiments/gpu/beyond_card_calls.sh tests OUT   # the GPU tests of the host's updates
#
# Each call starts with the machine (GPU, host memory, cores) and the date in OUT/machine.txt.
set -u
call=$1 OUT=$2
. experiments/gpu/setup.sh
export XDG_CACHE_HOME=/tmp/xdg
[ -f caches.tgz ] && tar xzf caches.tgz -C /tmp
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  grep MemAvailable /proc/meminfo; nproc; date -u; } > "$OUT/machine.txt"
B=experiments/gpu/beyond_card.py
ours=(--part ours --cap 24GiB --time-limit 30 --plans /tmp/plans)

part() {  # part NAME SECONDS ARGS...: one process, its log, its exit status in machine.txt
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" python3 $B "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? at $(date -u +%T)" >> "$OUT/machine.txt"
}

case $call in
  split) part uncapped_b4 70 --part uncapped --batch 4 --steps 6
         # the H200 holds batch 8 uncapped: the reference is the faster of the two
         part uncapped_b8 80 --part uncapped --batch 8 --steps 6
         part split70_b16 440 "${ours[@]}" --batch 16 --steps 8 --optimizer-on split \
              --host-share 0.7 ;;
  host)  part uncapped_b4 80 --part uncapped --batch 4 --steps 6
         part host_b16 330 "${ours[@]}" --batch 16 --steps 8 --optimizer-on host
         part fsdp_b8 120 --part fsdp --cap 24GiB --batch 8 --steps 5 ;;
  auto)  part uncapped_b4 80 --part uncapped --batch 4 --steps 6
         part split_b16 450 "${ours[@]}" --batch 16 --steps 8 --optimizer-on split ;;
  seven) part seven_host_b4 540 "${ours[@]}" --size 7b --batch 4 --steps 6 --optimizer-on host ;;
  eighty|card)
          if [ "$call" = eighty ]; then
            python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_trainer_gpu.py -k split \
                > "$OUT/tests.log" 2>&1
            echo "tests: exit $? at $(date -u +%T)" >> "$OUT/machine.txt"
          fi
          size=${SIZE:-7b}
          # the updates on the GPU: one plan to make (auto makes three), and the host holds
          # only what the cap leaves over (the host's AdamW state alone is 53 GB at 6.66B).
          # The cap: 80 GiB, or on a card without 80 GiB to give (an H100 80GB has 79.6 GiB in
          # all) the whole card less 3 GiB for CUDA's context and cuBLAS's workspaces
          total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits \
                  2>/dev/null | head -n 1)
          cap=80
          [ -n "$total" ] && [ $(( total / 1024 - 3 )) -lt 80 ] && cap=$(( total / 1024 - 3 ))
          part card_${size}_${cap}_b4 480 --part ours --cap ${cap}GiB --time-limit 30 \
               --plans /tmp/plans --size "$size" --batch 4 --steps 6 --optimizer-on gpu ;;
  tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_trainer_gpu.py \
             tests/test_executor_gpu.py -k "host or split or own_size" > "$OUT/tests.log" 2>&1
         echo "tests: exit $?" >> "$OUT/machine.txt" ;;
  *) echo "unknown call $call: split, host, auto, seven, eighty, card or tests" >&2; exit 2 ;;
esac
tar czf "$OUT/caches.tgz" -C /tmp xdg plans 2>/dev/null
cat "$OUT/machine.txt"
grep -h -E "^setup|^step [0-9]+:|split:|predicted" "$OUT"/*.log | tail -n 30
