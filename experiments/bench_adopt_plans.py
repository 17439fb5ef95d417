"""Put plans solved elsewhere (`autotm optimize -o`, experiments/gpu/plan_recompute.sh) into an
`autotm bench --plans` folder under the names the sweep looks for, so that `bench --execute`
on the GPU machine runs them instead of solving again (the GPU machine has no solver).

A plan is adopted only where it is what the sweep would solve for that cell: its header's
config equals the cell's `PlanConfig` (strategy, recompute, ratio, arena, graph, placed, read
pricing, solver settings, time limit...) and its graph is the model's (the sweep itself
re-solves a plan of another graph). Anything else is refused with the differing fields.

Usage (the sweep's options, then the plan files):
  python experiments/bench_adopt_plans.py --plans DIR --model resnet200 --batch 32 --training \
      --strategy async+recompute --time-limit 180 --arena --graph [--read-pricing spread] \
      PLAN.json.gz...
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotm_py.bench import BenchSpec  # noqa: E402
from autotm_py.bench.cells import ModelRunner  # noqa: E402
from autotm_py.cli.common import parse_dims  # noqa: E402
from autotm_py.options import ModelOptions, RunMode  # noqa: E402
from autotm_py.plan import Plan  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--plans", dest="plans_dir", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--dim", action="append", default=[])
    parser.add_argument("--training", action="store_true")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--solver", default="highs")
    parser.add_argument("--time-limit", type=float)
    parser.add_argument("--arena", action="store_true")
    parser.add_argument("--replay", "--graph", dest="replay", action="store_true")
    parser.add_argument("--no-placed", action="store_true")
    parser.add_argument("--read-pricing", default="step")
    args = parser.parse_args()
    dims = parse_dims(args.dim)
    ratios = {str(Plan.load(p).header.config["ratio"]) for p in args.plans}
    spec = BenchSpec(models=(args.model,), ratios=tuple(sorted(ratios)),
                     strategies=(args.strategy,), solvers=(args.solver,), device="cuda",
                     model=ModelOptions(batch=args.batch, dims=dims, training=args.training),
                     time_limit_s=args.time_limit, plans_dir=args.plans_dir,
                     run=RunMode(arena=args.arena, replay=args.replay,
                                 placed=not args.no_placed),
                     read_pricing=args.read_pricing)
    runner = ModelRunner(spec, args.model)
    if runner.error:
        raise SystemExit(f"{args.model}: {runner.error}")
    refused = 0
    for path in args.plans:
        plan = Plan.load(path)
        ratio = str(plan.header.config["ratio"])
        want = runner.config(ratio, args.strategy, args.solver).to_dict()
        differ = {k: (plan.header.config.get(k), v) for k, v in want.items()
                  if k != "threads" and plan.header.config.get(k) != v}
        if plan.header.model_hash != runner.graph.model_hash:
            differ["model_hash"] = (plan.header.model_hash, runner.graph.model_hash)
        if differ:
            refused += 1
            print(f"refused {path}: differs from the sweep's cell {ratio} in "
                  + ", ".join(f"{k} (plan {a!r}, sweep {b!r})" for k, (a, b) in differ.items()))
            continue
        target = spec.plan_path(args.model, ratio, args.strategy, args.solver)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        print(f"adopted {path} as {target}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
