"""Would VGG19 get arena plans if each kernel's workspace had a window of its own in the arena?

Today an arena keeps one scratch region at its top, as large as the largest kernel's scratch
(workspace plus outputs torch allocates outside their slots), for the whole iteration
(`arena.pack`). VGG19 b64's largest is 1.53 GiB of cuDNN workspace, so at 80% of its peak the
plan's tensors get 2.43 GiB and the packing does not fit (docs/gpu.md). The alternative: give
each kernel's scratch a planned offset *inside* the arena, live only while its kernel runs
([2i, 2i + 1) in the packer's half-steps), as the ILP's capacity rows already count it outside
arena mode. This packs the same plan both ways and prints what each arena needs against the
budget. A CPU experiment (no executor support exists for such windows):

    python experiments/scratch_windows.py vgg19 64 4:1,1:1,1:2,1:3 [--time-limit 60]

For each ratio: the plan solved without an arena (workspace in every kernel's row), its live
peak, the arena it would need today (tensors' packing + the largest scratch) and with scratch
windows packed among the tensors, beside the budget the tensors may use (budget - runtime
reserve).

Since 2026-11-28 (afternoon) this is a feature: `autotm optimize --arena --scratch windows`
(`MachineModel.windowed`, `arena.lifetimes`, served by the placed allocator; docs/gpu.md,
"Scratch windows"). This script stays as the record of the measurement that motivated it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotm_py import api
from autotm_py.arena import Lifetimes, Span, lifetimes, tightest_packing
from autotm_py.config import PlanConfig
from autotm_py.options import RunMode
from autotm_py.pipeline import machine_for
from autotm_py.plan import SCRATCH
from autotm_py.units import parse_ratio

GIB = 2**30


def extent(life: Lifetimes) -> int:
    offsets = tightest_packing(life)
    return max((offsets[i] + s.nbytes for i, s in enumerate(life.spans)), default=0)


def with_windows(life: Lifetimes) -> Lifetimes:
    """The same lifetimes with each compute's scratch as a buffer of its own, live while its
    kernel runs."""
    windows = tuple(Span(record, SCRATCH, 2 * record, 2 * record + 1, int(n))
                    for record, n in sorted(life.scratch.items()) if n > 0)
    return replace(life, spans=life.spans + windows, scratch={})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("ratios")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    graph = api.load_model(args.model, batch=args.batch, training=True)
    costs = api.load_costs(graph, device="cuda")
    print(f"{graph.name}: peak {graph.peak_live_bytes / GIB:.2f} GiB")
    for ratio in args.ratios.split(","):
        config = PlanConfig(device="cuda", ratio=parse_ratio(ratio), strategy="async",
                            recompute="on", run=RunMode(replay=True),
                            time_limit_s=args.time_limit)
        result = api.optimize(graph, config, costs=costs, baselines=False)
        if result.plan is None:
            print(f"{ratio}: no plan without an arena either ({result.message})")
            continue
        arena_machine = machine_for(graph, replace(config, run=replace(config.run, arena=True)),
                                    costs)
        life = lifetimes(arena_machine, result.plan)
        usable = arena_machine.user_budget - arena_machine.memory.runtime_reserve_bytes
        top_region = extent(life) + max(life.scratch.values(), default=0)
        windowed = extent(with_windows(life))
        print(f"{ratio}: tensors may use {usable / GIB:.2f} GiB; plan predicted "
              f"{result.plan.header.predicted_time_s * 1e3:.1f} ms, live peak with workspace "
              f"{with_windows(life).live_peak() / GIB:.2f} GiB; arena today (tensors + largest "
              f"scratch {max(life.scratch.values(), default=0) / GIB:.2f}) "
              f"{top_region / GIB:.2f} GiB, with scratch windows {windowed / GIB:.2f} GiB"
              f" -> {'fits' if windowed <= usable else 'does not fit'}", flush=True)


if __name__ == "__main__":
    main()
