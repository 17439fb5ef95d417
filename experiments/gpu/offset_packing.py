"""How much memory would a plan need if its tensors sat at planned offsets?

torch's caching allocator needed 5-25% of the budget as headroom for fragmentation on the H100
(docs/gpu.md). nGraph, AutoTM's runtime, placed tensors at offsets computed ahead of time. This
measures what that would cost for our plans, on the CPU from committed files: it walks a plan
with the simulator, records when each fast-memory copy (and each kernel's workspace) is taken
and released, packs those intervals into one arena with a greedy offline placement (largest
first, each at the lowest offset free over its whole lifetime), and compares the arena with the
largest sum of live bytes (what the ILP bounds).

Usage:
  python experiments/gpu/offset_packing.py experiments/results/gpu_h100.json [MODEL...]
Each measured row's plan at headroom 0 (experiments/plans/gpu, removed on 2026-11-28: solved
for graphs the importer no longer makes; `git show 9924961:experiments/plans/gpu/NAME` recovers
one) is packed; the line also gives
what the headroom the run needed costs: its plan's predicted time over the headroom-0 plan's
(both as solved, from the plan headers).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass(frozen=True)
class Interval:
    start: int  # half-steps: 2 x record index; a kernel's workspace lives in (2i, 2i + 1)
    end: int
    size: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    parser.add_argument("models", nargs="*")
    args = parser.parse_args()
    for row in json.loads(Path(args.document).read_text())["rows"]:
        if row.get("measured_s") and (not args.models or row["model"] in args.models):
            print(pack_row(row), flush=True)


def pack_row(row: dict) -> str:
    from diagnose import kept_plan, load_plan, row_cell

    from autotm_py import api

    headroom = row.get("headroom") or 0.0
    graph, plan = load_plan(*row_cell(row))
    fitted = kept_plan(*row_cell(row), headroom)
    costs = api.load_costs(graph, device="cuda")
    intervals, live_peak = lifetimes(graph, plan, costs)
    arena = pack(intervals)
    cost = fitted.header.predicted_time_s / plan.header.predicted_time_s - 1
    return (f"{row['model']:12s} {row['ratio']} {row['strategy']:5s} live peak "
            f"{live_peak / 2**20:7.0f} MiB  packed arena {arena / 2**20:7.0f} MiB  "
            f"(+{(arena / live_peak - 1) * 100:4.1f}%); torch needed headroom {headroom:.2f}, "
            f"predicted +{cost * 100:4.1f}% over headroom 0")


def lifetimes(graph, plan, costs) -> tuple[list[Interval], int]:
    """Every fast-memory copy's [taken, released) in half-steps, each kernel's workspace, and
    the simulator's fast peak (the largest sum of live bytes, workspace included)."""
    from autotm_py.memory.tiers import FAST
    from autotm_py.pipeline import machine_for_plan
    from autotm_py.plan import Compute
    from autotm_py.runtime.simulate import Simulator

    class Recorder(Simulator):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.open: dict[int, int] = {}
            self.done: list[Interval] = []

        def alloc(self, tid: int, tier: str, state: int = 1) -> None:
            super().alloc(tid, tier, state)
            if tier == FAST and self.size(tid):
                self.open[tid] = 2 * max(self.index, 0)

        def release(self, tid: int, tier: str) -> None:
            super().release(tid, tier)
            if tier == FAST and tid in self.open:
                self.done.append(Interval(self.open.pop(tid), 2 * self.index, self.size(tid)))

    machine = machine_for_plan(graph, plan, costs)
    sim = Recorder(graph, plan, machine, strict=False)
    sim.run()
    end = 2 * len(plan.records) + 2
    intervals = sim.done + [Interval(start, end, sim.size(tid)) for tid, start in sim.open.items()]
    for i, record in enumerate(plan.records):
        workspace = int(machine.workspace[record.kernel]) if isinstance(record, Compute) else 0
        if workspace:
            intervals.append(Interval(2 * i, 2 * i + 1, workspace))
    intervals = [iv if iv.end > iv.start else Interval(iv.start, iv.start + 1, iv.size)
                 for iv in intervals]
    return intervals, sim.result().fast_peak_bytes


def pack(intervals: list[Interval]) -> int:
    """Greedy offline placement: largest first, each at the lowest offset where it overlaps no
    placed interval that is live at the same time. Returns the arena's size in bytes."""
    placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, size), by start
    arena = 0
    for iv in sorted(intervals, key=lambda v: (-v.size, v.start)):
        before_end = bisect.bisect_left(placed, (iv.end,))  # placed ones that start before
        busy = sorted((offset, offset + size) for _, end, offset, size in placed[:before_end]
                      if end > iv.start)
        offset = 0
        for low, high in busy:
            if offset + iv.size <= low:
                break
            offset = max(offset, high)
        bisect.insort(placed, (iv.start, iv.end, offset, iv.size))
        arena = max(arena, offset + iv.size)
    return arena


if __name__ == "__main__":
    main()
