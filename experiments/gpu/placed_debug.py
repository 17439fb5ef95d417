"""Which kernels of a plan do not get their outputs at their slots under the placed allocator,
and why: one eager iteration at planned addresses under the plan's cap, in a fresh process,
printing for every kernel whose outputs were offered but not all placed, or during which the
allocator's region overflowed: the slots offered, each output's address, size and strides,
the inputs' sizes and strides, and the region's bytes in use and overflow before and after.

Usage (GPU machine, repository root): python3 experiments/gpu/placed_debug.py PLAN.json.gz
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(path: Path) -> None:
    from autotm_py import api
    from autotm_py.options import RunMode
    from autotm_py.plan import Plan

    plan = Plan.load(path)
    mode = RunMode(arena=True, placed=True)
    print("placed allocator:", "; ".join(api.prepare_cuda_process(plan, "cuda", mode)) or
          "installed")
    from prefetch_join_check import load

    from autotm_py.runtime import memory as ex
    from autotm_py.runtime import placed

    graph, plan = load(path)
    lib = placed.active()
    original = ex.ArenaMemory._run_placed

    def traced(self, kernel, args, slots):
        before = lib.stats()
        outputs = original(self, kernel, args, slots)
        after = lib.stats()
        wanted = [s for s in slots if s is not None]
        at_slot = sum(1 for o, s in zip(outputs, slots, strict=True)
                      if s is not None and o.data_ptr() == s.data_ptr())
        if at_slot < len(wanted) or after.overflow_allocations > before.overflow_allocations:
            print(f"{kernel.name} ({kernel.op_type}): {at_slot}/{len(wanted)} placed; in use "
                  f"{before.in_use_bytes >> 20} -> {after.in_use_bytes >> 20} MiB, peak "
                  f"{after.peak_in_use_bytes >> 20}, extent {after.peak_extent_bytes >> 20}, "
                  f"overflow {before.overflow_bytes >> 20} -> {after.overflow_bytes >> 20} MiB")
            for o, s in zip(outputs, slots, strict=True):
                print("   out", tuple(o.shape), o.stride(), o.nbytes >> 10, "KiB at slot",
                      s is not None and o.data_ptr() == s.data_ptr(),
                      "slot", None if s is None else (tuple(s.shape), s.nbytes >> 10))
            for a in args:
                print("   in ", tuple(a.shape), a.stride(), a.is_contiguous(), a.nbytes >> 10)
        return outputs

    ex.ArenaMemory._run_placed = traced
    run = api.execute(graph, plan, device="cuda", iterations=1, warmup=0, mode=mode)
    print("median", run.median_s, "retries", run.alloc_retries, "reserved",
          (run.reserved_peak_bytes or 0) >> 20, "cap", (run.cap_bytes or 0) >> 20, run.notes)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
