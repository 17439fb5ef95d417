"""Host-mode check against the AutoTM paper: DRAM + Optane (`optane` preset) at fast:slow 1:4
(the paper's PMM:DRAM 4:1, DRAM = 20% of the footprint), training at the paper's batches.

The paper reports a geometric-mean loss of about 27.7% for its synchronous ILP and 71.9% for
first-touch NUMA, over Inception-v4, ResNet-200, VGG19 and DenseNet-264, measured on a 24-core
Cascade Lake with Optane DC PMM. Here the slow tier is modelled (no Optane on this machine):
each kernel's time with operands in the slow tier is its measured DRAM time on *this* CPU plus
the bytes it streams at Optane's bandwidths. How much the slow tier hurts therefore depends on
how fast the CPU computes; `--speedups` re-runs the check with every kernel's DRAM time divided
by a factor, to show a CPU that computes that many times faster than this one.

    python experiments/host_check.py [--speedups 1,8,32] [-o experiments/results/host_check]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autotm_py import api  # noqa: E402
from autotm_py.config import PlanConfig  # noqa: E402
from autotm_py.costs import KernelCosts  # noqa: E402
from autotm_py.fileio import atomic_write_text  # noqa: E402
from autotm_py.pipeline import machine_for, run_baselines  # noqa: E402
from autotm_py.units import parse_ratio  # noqa: E402

MODELS = ("inception_v4", "resnet200", "vgg19", "densenet264")
PAPER = {"sync": 0.277, "first-touch": 0.719}


def faster(costs: KernelCosts, factor: float) -> KernelCosts:
    """Kernel costs of a CPU that computes `factor` times faster than the profiled one."""
    def scale(xs: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(x / factor for x in xs)

    return replace(costs, times_s=scale(costs.times_s), p10_s=scale(costs.p10_s),
                   p90_s=scale(costs.p90_s))


def check(speedup: float, solver: str) -> dict[str, object]:
    rows = []
    for name in MODELS:
        graph = api.load_model(name, training=True)
        costs = faster(api.load_costs(graph, device="cpu"), speedup)
        config = PlanConfig(strategy="sync", ratio=parse_ratio("1:4"), device="cpu",
                            memory="optane", solver=solver)
        result = api.optimize(graph, config, costs=costs)
        base = run_baselines(machine_for(graph, config, costs), ("first-touch", "all-slow"))
        fast = result.all_fast_time_s
        rows.append({"model": name, "batch": graph.meta.get("dims", {}).get("batch"),
                     "all_fast_s": fast, "sync_slowdown": result.slowdown,
                     "first_touch_slowdown": base["first-touch"].time_s / fast,
                     "all_slow_slowdown": base["all-slow"].time_s / fast,
                     "status": result.status})
        print(f"  x{speedup:g} {name}: sync {result.slowdown:.3f}, first-touch "
              f"{base['first-touch'].time_s / fast:.3f}, all-slow "
              f"{base['all-slow'].time_s / fast:.3f}", flush=True)
    geo = {key: statistics.geometric_mean(r[key] for r in rows)
           for key in ("sync_slowdown", "first_touch_slowdown", "all_slow_slowdown")}
    return {"speedup": speedup, "rows": rows, "geomean": geo}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speedups", default="1,8,32")
    parser.add_argument("--solver", default="highs")
    parser.add_argument("-o", "--out", type=Path, default=HERE / "results" / "host_check")
    args = parser.parse_args()
    runs = [check(float(s), args.solver) for s in args.speedups.split(",")]
    doc = {"format": "autotm-host-check", "version": 1, "ratio": "1:4", "memory": "optane",
           "paper_loss": PAPER, "runs": runs}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(doc, indent=1) + "\n")
    print("compute speed-up | sync loss | first-touch loss | all-slow loss   "
          "(paper: 27.7% | 71.9%)")
    for run in runs:
        g = run["geomean"]
        print(f"x{run['speedup']:<15g} | {100 * (g['sync_slowdown'] - 1):8.1f}% | "
              f"{100 * (g['first_touch_slowdown'] - 1):15.1f}% | "
              f"{100 * (g['all_slow_slowdown'] - 1):12.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
